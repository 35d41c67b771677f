"""One CUDA kernel for a whole scaled-dot-product attention: scores, mask, softmax and P @ V.

Unfused, a transformer layer's attention at batch 1 is seven launches (Q/K/V and context
transposes, the two matmuls, softmax), all launch-bound at a small share, and a large part of
BERT-base's time (benchmarks/RESULTS.md, "BERT attention"). This kernel reads Q, K and V
where they already are (the combined QKV projection's output, by strides), keeps K and V in shared
memory, and writes the context in [B, S, H, D], which is what the output projection reads after a
reshape that costs nothing.

One thread block per (batch, head, tile of ROWS query rows). Two bodies, chosen by `plan`:
- attention_mma: tensor cores (PTX mma.sync m16n8k16, fp16 in, fp32 accumulate) for Q K^T and
  P V, four warps, scores kept in registers; for head dims that are a multiple of 32 (BERT: 64);
- attention_simt: CUDA cores, 16 threads per query row, fp32 arithmetic; any head dim.
They are written by hand (`tirx.is_scheduled`: MetaSchedule and DLight leave them alone) because
MetaSchedule's rules never put several reductions into one kernel. `plan` says None for shapes
whose K and V do not fit a block's shared memory; `key_tiles` (what frontend.precision asks for) then gives
attention_flash, which passes over the keys a tile at a time with an online softmax (head dims a multiple of 32).

`attention_kernel(..., gpu=False)` is the same loop nest with serial loops in place of the thread
bindings (each phase's loop over threads runs to the end before the next starts, as the barrier
between them ensures on the GPU), so its arithmetic and indexing can be checked on a CPU. The
tensor-core body's mma instructions become plain dot products there: the elements each thread
owns are the same, the fragments they are gathered from are checked on the GPU only.
"""
from __future__ import annotations

import functools

from .attention_flash import attention_flash
from .attention_mma import attention_mma
from .attention_simt import attention_simt
from ..kernels.triton_attention import SPEC_ATTR, spec_json
from .attention_spec import Attention, Operand, Plan, plan

__all__ = ["Attention", "Operand", "Plan", "attention_kernel", "plan"]


@functools.lru_cache(maxsize=64)  # a model's layers share one spec: parsing its TVMScript took 0.3 s a layer
def attention_kernel(spec: Attention, *, gpu: bool = True, tensor_cores: bool = True, key_tiles: bool = False):
    """The PrimFunc (q_src, k_src, v_src, mask, out[B, S, H, D] fp16) for `spec` (module doc)."""
    shape = plan(spec, tensor_cores=tensor_cores, key_tiles=key_tiles)
    if shape is None:
        raise ValueError("attention does not fit one thread block's shared memory")
    body = attention_flash if shape.key_tile else attention_mma if shape.tensor_cores else attention_simt
    # the spec on the kernel: a kernel of another kind can compute the same (kernels.triton_attention)
    return body(spec, shape, gpu=gpu).with_attr(SPEC_ATTR, spec_json(spec))
