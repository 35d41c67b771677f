"""One CUDA kernel for a whole scaled-dot-product attention: scores, mask, softmax and P @ V.

Unfused, a transformer layer's attention at batch 1 is seven launches (Q/K/V and context
transposes, the two matmuls, softmax) of 3-7 µs each at a 40% share, all launch-bound:
BERT-base spent ~320 µs of its ~1 ms there at 40% of an H100. This kernel reads Q, K and V
where they already are (the combined QKV projection's output, by strides), keeps K and V in shared
memory, and writes the context in [B, S, H, D], which is what the output projection reads after a
reshape that costs nothing.

One thread block per (batch, head, tile of ROWS query rows). Two bodies, chosen by `plan`:
- attention_mma: tensor cores (PTX mma.sync m16n8k16, fp16 in, fp32 accumulate) for Q K^T and
  P V, four warps, scores kept in registers; for head dims that are a multiple of 32 (BERT: 64);
- attention_simt: CUDA cores, 16 threads per query row, fp32 arithmetic; any head dim.
They are written by hand (`tirx.is_scheduled`: MetaSchedule and DLight leave them alone) because
MetaSchedule's rules never put several reductions into one kernel. `plan` says None for shapes
whose K and V do not fit a block's shared memory; those keep the unfused graph.

`attention_kernel(..., gpu=False)` is the same loop nest with serial loops in place of the thread
bindings (each phase's loop over threads runs to the end before the next starts, as the barrier
between them ensures on the GPU), so its arithmetic and indexing can be checked on a CPU. The
tensor-core body's mma instructions become plain dot products there: the elements each thread
owns are the same, the fragments they are gathered from are checked on the GPU only.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

F16, F32 = "float16", "float32"
ROWS = 16            # query rows per thread block (one m16 tile)
VECTOR = 8           # fp16 elements per 16-byte load
SHARED_LIMIT = 48 * 1024  # static shared memory per block (what TVM's CUDA codegen declares)
SIMT_THREADS_PER_ROW = 16
MMA_WARPS = 4


@dataclass(frozen=True)
class Operand:
    """Where Q, K or V element (b, h, s, d) is in its source tensor: flat offset + strides."""

    shape: tuple[int, ...]   # the source tensor's shape (what call_tir passes)
    dtype: str
    offset: int
    strides: tuple[int, int, int, int]  # of b, h, s, d

    def numel(self) -> int:
        return math.prod(self.shape)

    def vector(self, head_dim: int) -> int:
        """Elements per load: 16-byte loads where d is contiguous and every start is 8-aligned."""
        sb, sh, ss, sd = self.strides
        aligned = all(x % VECTOR == 0 for x in (self.offset, sb, sh, ss, head_dim))
        return VECTOR if sd == 1 and aligned and self.dtype == F16 else 1


@dataclass(frozen=True)
class Attention:
    """softmax(Q K^T * scale + mask) V for Q [B, H, S, D] and K, V [B, H, SK, D]."""

    batch: int
    heads: int
    seq: int        # query rows
    keys: int       # key rows
    head_dim: int
    q: Operand
    k: Operand
    v: Operand
    mask: Operand   # strides of (b, h, i, j); 0 along broadcast dims
    scale: float


@dataclass(frozen=True)
class Plan:
    tensor_cores: bool
    threads: int
    keys: int              # keys padded: SIMT, a multiple of 16 threads per row; mma, of 32 (8 per warp tile)
    query_tiles: int
    shared_bytes: int


def plan(spec: Attention, *, tensor_cores: bool = True) -> Plan | None:
    """The kernel body and launch shape for `spec`, or None when its K and V do not fit a block.
    `tensor_cores=False`: the CUDA-core body whatever the head dim (for comparisons)."""
    d, tiles = spec.head_dim, -(-spec.seq // ROWS)
    if tensor_cores and d % (8 * MMA_WARPS) == 0:
        keys = -(-spec.keys // (8 * MMA_WARPS)) * 8 * MMA_WARPS
        # Q, K, V with rows padded by 16 bytes (conflict-free fragment loads; P reuses K's), and
        # the per-row max / sum partials of 4 threads x 4 warps
        shared = (ROWS + 2 * keys) * (d + VECTOR) * 2 + 2 * ROWS * 4 * MMA_WARPS * 4
        if shared <= SHARED_LIMIT:
            return Plan(True, 32 * MMA_WARPS, keys, tiles, shared)
    keys = -(-spec.keys // SIMT_THREADS_PER_ROW) * SIMT_THREADS_PER_ROW
    # K (padded rows; P reuses it), V and Q in fp16; scores and the row max / sum partials in fp32
    shared = (max(keys * (d + VECTOR), ROWS * keys) * 2 + keys * d * 2 + ROWS * d * 2
              + ROWS * keys * 4 + 2 * ROWS * SIMT_THREADS_PER_ROW * 4)
    if shared > SHARED_LIMIT:
        return None
    return Plan(False, ROWS * SIMT_THREADS_PER_ROW, keys, tiles, shared)


def attention_kernel(spec: Attention, *, gpu: bool = True, tensor_cores: bool = True):
    """The PrimFunc (q_src, k_src, v_src, mask, out[B, S, H, D] fp16) for `spec` (module doc)."""
    shape = plan(spec, tensor_cores=tensor_cores)
    if shape is None:
        raise ValueError("attention does not fit one thread block's shared memory")
    if shape.tensor_cores:
        from .attention_mma import attention_mma

        return attention_mma(spec, shape, gpu=gpu)
    from .attention_simt import attention_simt

    return attention_simt(spec, shape, gpu=gpu)


class Loops:
    """What the two kernel bodies share: the loop kinds and scopes of the GPU / CPU variants, where
    an operand's element is, and the cooperative load of operand rows into shared memory."""

    def __init__(self, spec: Attention, shape: Plan, *, gpu: bool):
        from tvm.script import tirx as T

        self.gpu = gpu
        self.threads = (lambda n: T.thread_binding(n, thread="threadIdx.x")) if gpu else T.serial
        self.blocks = (lambda n: T.thread_binding(n, thread="blockIdx.x")) if gpu else T.serial
        self.shared = "shared" if gpu else "global"
        D, NT = spec.head_dim, shape.threads
        at = self.at

        @T.macro
        def load_rows(dst, src, op, count, first, valid, vec, row_stride, b, h, tx):
            """dst's rows 0..count-1 = rows first..first+count-1 of operand `op` (zeros past `valid`)."""
            for it in T.serial(-(-(count * D // vec) // NT)):
                c = it * NT + tx
                if c < count * D // vec:
                    for e in T.vectorized(vec):
                        dst[c // (D // vec) * row_stride + c % (D // vec) * vec + e] = T.if_then_else(
                            first + c // (D // vec) < valid,
                            src[at(op, b, h, first + c // (D // vec), c % (D // vec) * vec + e)], T.float16(0))

        self.load_rows = load_rows

    @staticmethod
    def at(op: Operand, b, h, s, d):
        sb, sh, ss, sd = op.strides
        return op.offset + b * sb + h * sh + s * ss + d * sd
