"""The precision a model is tuned and compiled in, and the Relax passes that give it.

fp16 (`--precision fp16`, and `auto` on a GPU with tensor cores): reshapes that only move leading
dims are deferred past matmuls (frontend.reshapes), parallel matmuls are combined
(frontend.combine), convs are converted to NHWC, and then the whole model runs in fp16 with every
conv/matmul accumulating in fp32 (frontend.half; ToMixedPrecision where that cannot); matmuls with
a long reduction and a narrow output are then split along K (frontend.split_k), and each
scaled-dot-product attention becomes one kernel (frontend.attention). The tasks
extracted afterwards carry fp16 workloads, which MetaSchedule's `cuda-tensorcore` rules (chosen by
itself for sm_75+) map onto tensor cores (WMMA 16x16x16 f16·f16->f32); fp32 never does (TVM 0.27
has no TF32 intrinsic), and tensor-core convs want NHWC. The model's inputs and outputs stay fp32.

Both passes run on the module as imported, before prepare_for_tuning: afterwards no relax.nn.conv2d
is left and they change nothing. ToMixedPrecision (0.27) fails on any R.call_tir, which the ONNX
importer emits for Clip (MobileNet's relu6), Pad, Tile, Resize and Einsum: constant-bound clips are
rewritten to maximum/minimum first, contractions and constant pads are lifted back to Relax
(frontend.tir_calls), and negative axes made positive (frontend.axes: ConvertLayout fails on them).

What frontend.half still cannot retype (another call_tir, an op that makes fp32 from nothing) is
converted as before, by ToMixedPrecision, where that pass can; where it cannot, the model is fp16
except those bindings, each kept in fp32 with casts at its boundary (`fp32_kept(mod)` names them;
the model's convs and matmuls stay fp16). A step that only makes the fp16 model faster (clips,
deferred reshapes, combined matmuls, NHWC, split-K, fused attention) is skipped where it fails
(`skipped_steps(mod)`). A model that still cannot be converted is tuned in fp32 when the precision
was `auto`, and refused in one line when fp16 was asked for.
"""
from __future__ import annotations

import logging
from collections import Counter

from ..errors import TunekitError

log = logging.getLogger("tunekit")

PRECISIONS = ("auto", "fp32", "fp16")


def has_tensor_cores(target) -> bool:
    """TVM's tensor-core schedule rules are selected for CUDA targets of sm_75 and newer."""
    if target.kind.name != "cuda":
        return False
    digits = "".join(ch for ch in str(target.arch).removeprefix("sm_") if ch.isdigit())
    return bool(digits) and int(digits) >= 75


def resolve_precision(precision: str, target) -> str:
    """auto -> fp16 on a GPU with tensor cores, fp32 elsewhere. fp16 on a CPU is refused: TVM's
    LLVM backend emulates half floats, which makes a model slower, not faster."""
    if precision not in PRECISIONS:
        raise TunekitError(f"--precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if precision == "auto":
        return "fp16" if has_tensor_cores(target) else "fp32"
    if precision == "fp16" and target.kind.name != "cuda":
        raise TunekitError("--precision fp16 needs a GPU target (CPU shares are tuned in fp32)")
    return precision


def _clips_to_ops(mod):
    """call_tir(maximum*/minimum*, (x, scalar constant)) -> R.maximum / R.minimum (see module doc)."""
    import tvm
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator

    @mutator
    class Rewrite(PyExprMutator):
        def visit_call_(self, call):
            call = self.visit_expr_post_order(call)
            if getattr(call.op, "name", None) != "relax.call_tir":
                return call
            name = call.args[0].name_hint
            op = relax.op.maximum if name.startswith("maximum") else relax.op.minimum if name.startswith(
                "minimum") else None
            fields = getattr(call.args[1], "fields", ())
            if op is None or len(fields) != 2:
                return call
            x, bound = fields
            if isinstance(bound, relax.Var):
                bound = self.lookup_binding(bound) or bound
            if not isinstance(bound, tvm.ir.expr.Constant) or len(bound.ty.shape) != 0:
                return call
            return op(x, bound)

    mod = relax.transform.FoldConstant()(mod)  # folds the importer's where(isnan(bound), ...) around the bounds
    mod["main"] = Rewrite(mod).visit_expr(mod["main"])
    return relax.transform.DeadCodeElimination()(mod)


FP32_KEPT = "tunekit.fp32_kept"  # module attrs: what a partial fp16 conversion left out
SKIPPED_STEPS = "tunekit.fp16_skipped_steps"


def fp32_kept(mod) -> list[str]:
    """The bindings a partial fp16 conversion kept in fp32, one "var: op (why)" each; [] when none
    (also on a module that was never converted). Survives prepare_for_tuning."""
    return [str(x) for x in (mod.attrs or {}).get(FP32_KEPT, [])]


def skipped_steps(mod) -> list[str]:
    """The fp16 conversion's optional steps that failed on this model, "step (why)" each; [] when none."""
    return [str(x) for x in (mod.attrs or {}).get(SKIPPED_STEPS, [])]


def _last_line(exc) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:200]


def _optional(name, step, mod, skipped, *, counted=False):
    """step(mod), or `mod` (`(mod, 0)` for a step that counts what it did) when the step fails: it
    only makes the fp16 model faster."""
    try:
        return step(mod)
    except Exception as exc:
        log.warning("fp16: %s skipped on this model: %s", name, _last_line(exc))
        skipped.append(f"{name} ({_last_line(exc)})")
        return (mod, 0) if counted else mod


def _noted(mod, kept, skipped):
    """`mod` with what the conversion left out as module attrs (none added when nothing was)."""
    if kept:
        mod = mod.with_attr(FP32_KEPT, kept)
    if skipped:
        mod = mod.with_attr(SKIPPED_STEPS, skipped)
    return mod


def _to_half(mod):
    """(mod in fp16, bindings kept in fp32): frontend.half, else ToMixedPrecision as before, else
    frontend.half with the bindings it cannot retype left in fp32."""
    from tvm import relax

    from .half import NotHalvable, to_half_partial

    try:
        half, kept = to_half_partial(mod)
    except NotHalvable as exc:
        half, kept = None, [str(exc)]
    if not kept:
        return half, []
    try:
        mixed = relax.transform.ToMixedPrecision(out_dtype="float32")(mod)
    except Exception:
        if half is None:
            raise
        counts = Counter(k.split(": ", 1)[1].split(" (", 1)[0] for k in kept)
        log.info("fp16 but for %d bindings, kept in fp32 with casts at their boundary: %s", len(kept),
                 ", ".join(f"{n} x {what}" for what, n in counts.most_common()))
        return half, kept
    log.info("fp16: %s; fp16 matmul/conv inputs only (ToMixedPrecision)", kept[0])
    return mixed, None


def convert(mod, precision: str, *, target_kind: str = "cuda", fuse_attention: bool = True, split_k: bool = True):
    """The imported Relax module in `precision` (fp32: unchanged). Raises TunekitError when TVM
    cannot convert it. fp16 is the whole model in fp16 with fp32 accumulation (frontend.half); a
    graph that pass cannot retype gets ToMixedPrecision, which keeps fp32 between the matmuls, or
    where that fails too, frontend.half with those bindings in fp32 (module doc: fp32_kept).
    `target_kind`: what the fused attention kernels are written for (not "cuda": the same loops run
    serially, which only tests use, to check the fp16 model's numerics on a CPU);
    `fuse_attention=False` keeps attention unfused, `split_k=False` long reductions whole (both for comparisons)."""
    if precision == "fp32":
        return mod
    from tvm import relax

    from .attention import fuse_attention as fuse
    from .axes import positive_axes
    from .combine import combine_parallel_matmuls
    from .reshapes import defer_reshapes
    from .split_k import split_long_reductions
    from .tir_calls import lift_tir_calls

    skipped = []
    try:
        mod = _optional("relu6 clips as maximum/minimum", _clips_to_ops, mod, skipped)
        mod, lifted = lift_tir_calls(mod)
        if lifted:
            log.info("fp16: lifted to Relax: %s", ", ".join(f"{n} {kind}" for kind, n in sorted(lifted.items())))
        mod = positive_axes(mod)[0]
        mod = _optional("deferred reshapes", defer_reshapes, mod, skipped)
        mod = _optional("combined matmuls", combine_parallel_matmuls, mod, skipped)
        mod = _optional("NHWC convs", relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]}), mod,
                        skipped)
        mod, kept = _to_half(mod)
        if kept is None:  # ToMixedPrecision's module, as before
            return _noted(mod, [], skipped)
        mod, split = _optional("split-K", split_long_reductions, mod, skipped, counted=True) if split_k else (mod, 0)
        if split:
            log.info("fp16: %d matmuls split along K", split)
        if fuse_attention:
            # where K and V do not fit a block, the key-tiled kernel (benchmarks/RESULTS.md, "key-tiled attention")
            mod, fused = _optional("fused attention", lambda m: fuse(m, gpu=target_kind == "cuda", key_tiles=True),
                                   mod, skipped, counted=True)
            if fused:
                log.info("fp16: %d attentions fused into one kernel each", fused)
        return _noted(mod, kept, skipped)
    except Exception as exc:
        raise TunekitError(f"TVM cannot convert this model to fp16 ({_last_line(exc)}); use --precision fp32") from None


def prepare(mod, target, *, precision: str, fuse_attention: bool = True, fold_kernels: bool = True,
            split_k: bool = True):
    """(prepared module, precision it is in): `mod` converted, then frontend.tasks.prepare_for_tuning.
    `precision` is resolved first (resolve_precision); `auto` falls back to fp32 when the model
    cannot be converted (the reason is logged). A model converted but for a few bindings is "fp16":
    fp32_kept(prepared) names those, skipped_steps(prepared) the optional steps that failed.
    `fuse_attention`, `split_k`: see convert; `fold_kernels`: see prepare_for_tuning (all for comparisons)."""
    from .powers import powers_as_products
    from .tasks import prepare_for_tuning

    resolved = resolve_precision(precision, target)
    if target.kind.name == "cuda":  # fast-math powf is NaN for a negative base (frontend.powers)
        mod, rewritten = powers_as_products(mod)
        if rewritten:
            log.info("%d integer powers written as products", rewritten)
    try:
        converted = convert(mod, resolved, target_kind=target.kind.name, fuse_attention=fuse_attention,
                            split_k=split_k)
    except TunekitError as exc:
        if precision != "auto":
            raise
        log.warning("precision auto: %s; tuning in fp32", exc)
        converted, resolved = mod, "fp32"
    return prepare_for_tuning(converted, target, fold_kernels=fold_kernels), resolved
