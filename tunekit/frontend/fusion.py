"""Which kernels a model is cut into: Relax's "zero" pipeline (LegalizeOps, AnnotateTIROpPattern,
FoldConstant, FuseOps, FuseTIR), with two changes on GPUs, where every kernel boundary costs a
launch of a few µs at a small share, and most of BERT-base's small kernels ran at that floor
(benchmarks/RESULTS.md, "BERT attention"):

- **Gathers are injective.** AnnotateTIROpPattern calls `take` opaque, because its index is read
  from a tensor; so nothing fused with it and BERT's embedding lookup, its index wrap-around
  (where(ids < 0, ids + V, ids)) and the embedding sum were three kernels, and the attention mask's
  take another. Each output element of a take reads one input element, which is what FuseOps'
  `kInjective` means; marked so, they fuse like any reshape.
- **The elementwise kernel in front of a LayerNorm joins it** (frontend.norm_prologue).
- **A constant weight whose rows do not start on 16 bytes is stored transposed** (frontend.aligned_weights).

CPU targets keep the zero pipeline as it is (nothing measured there).
"""
from __future__ import annotations

from tvm import relax

from .aligned_weights import transpose_unaligned_weights
from .norm_prologue import INJECTIVE, fold_norm_prologues

OPAQUE = 8
GATHERS = ("take",)


def mark_gathers_injective(mod):
    """Legalized `take` kernels, marked opaque by AnnotateTIROpPattern, marked injective."""
    for gv, func in list(mod.functions.items()):
        if (gv.name_hint.startswith(GATHERS) and func.attrs is not None
                and int(func.attrs.get("op_pattern", -1)) == OPAQUE):
            mod[gv] = func.with_attr("op_pattern", INJECTIVE)
    return mod


def fuse_kernels(mod, *, gpu: bool):
    """The legalized, fused module (the current target must be set: LegalizeOps reads it)."""
    mod = relax.transform.LegalizeOps()(mod)
    mod = relax.transform.AnnotateTIROpPattern()(mod)
    if gpu:
        mod = mark_gathers_injective(mod)
    mod = relax.transform.FoldConstant()(mod)
    if gpu:
        mod, _ = transpose_unaligned_weights(mod)
    mod = relax.transform.FuseOps()(mod)
    if gpu:
        mod, _ = fold_norm_prologues(mod)
    return relax.transform.FuseTIR()(mod)
