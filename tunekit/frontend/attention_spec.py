"""What the fused attention kernel computes and how it is laid out: the operands (where each of Q,
K and V is in its source tensor), the launch plan (which body, how many threads, shared memory),
and the loops and loads both bodies share. frontend.attention_kernel builds the kernel.
"""
from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

F16, F32 = "float16", "float32"
ROWS = 16            # query rows per thread block (one m16 tile)
VECTOR = 8           # fp16 elements per 16-byte load
SHARED_LIMIT = 48 * 1024  # static shared memory per block (what TVM's CUDA codegen declares)
SIMT_THREADS_PER_ROW = 16
MMA_WARPS = 4
KEY_TILES = (128, 64, 32)  # keys per pass of the key-tiled body, largest first (a multiple of 8 per warp)


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
    key_tile: int = 0      # keys per pass of the key-tiled body (attention_flash); 0: all keys at once


def plan(spec: Attention, *, tensor_cores: bool = True, key_tiles: bool = False) -> Plan | None:
    """The kernel body and launch shape for `spec`, or None when its K and V do not fit a block.
    `tensor_cores=False`: the CUDA-core body whatever the head dim (for comparisons). `key_tiles`: where K and V
    do not fit, the key-tiled tensor-core body (attention_flash), for head dims a multiple of 16 (in shared memory
    padded with zeros to a multiple of 32: 80 is computed as 96)."""
    d, tiles = spec.head_dim, -(-spec.seq // ROWS)
    if tensor_cores and d % (8 * MMA_WARPS) == 0:
        keys = -(-spec.keys // (8 * MMA_WARPS)) * 8 * MMA_WARPS
        if _mma_shared(keys, d) <= SHARED_LIMIT:
            return Plan(True, 32 * MMA_WARPS, keys, tiles, _mma_shared(keys, d))
    keys = -(-spec.keys // SIMT_THREADS_PER_ROW) * SIMT_THREADS_PER_ROW
    # K (padded rows; P reuses it), V and Q in fp16; scores and the row max / sum partials in fp32
    shared = (max(keys * (d + VECTOR), ROWS * keys) * 2 + keys * d * 2 + ROWS * d * 2
              + ROWS * keys * 4 + 2 * ROWS * SIMT_THREADS_PER_ROW * 4)
    if shared <= SHARED_LIMIT:
        return Plan(False, ROWS * SIMT_THREADS_PER_ROW, keys, tiles, shared)
    if key_tiles and tensor_cores and d % 16 == 0:  # the largest tile that fits: the fewest passes over the keys
        padded = padded_head_dim(d)
        tile = next((t for t in KEY_TILES if _mma_shared(t, padded) <= SHARED_LIMIT), None)
        if tile is not None:
            return Plan(True, 32 * MMA_WARPS, -(-spec.keys // tile) * tile, tiles, _mma_shared(tile, padded), tile)
    return None


def padded_head_dim(d: int) -> int:
    """The head dim the tensor-core products work on: a multiple of 32 (8 output columns per warp and n-tile)."""
    return -(-d // (8 * MMA_WARPS)) * 8 * MMA_WARPS


def _mma_shared(keys: int, d: int) -> int:
    """Shared bytes of the tensor-core bodies for `keys` keys at a time: Q, K, V with rows padded by 16 bytes
    (conflict-free fragment loads; P reuses K's), and the per-row max / sum partials of 4 threads x 4 warps."""
    return (ROWS + 2 * keys) * (d + VECTOR) * 2 + 2 * ROWS * 4 * MMA_WARPS * 4


def kernel_symbol(spec: Attention, shape: Plan, *, gpu: bool) -> str:
    """The kernel's global symbol: its body and shape, and a digest of everything it is built from (operand
    layouts, mask, scale, plan, GPU or CPU loops). A model's kernels of different specs get different symbols
    (one symbol for two kernels fails the build), the same spec the same symbol on every run (records and
    artifacts may name kernels), and structurally equal kernels stay equal, so a module keeps one of them."""
    digest = hashlib.sha1(repr((spec, shape, gpu)).encode()).hexdigest()[:10]
    body = "flash" if shape.key_tile else "mma" if shape.tensor_cores else "simt"
    return (f"attention_{body}_b{spec.batch}h{spec.heads}s{spec.seq}k{spec.keys}d{spec.head_dim}"
            f"{'' if gpu else '_cpu'}_{digest}")


class Loops:
    """What the two kernel bodies share: the loop kinds and scopes of the GPU / CPU variants, where
    an operand's element is, the cooperative load of operand rows into shared memory, and the
    kernel's signature around a body's per-block macro."""

    def __init__(self, spec: Attention, shape: Plan, *, gpu: bool):
        from tvm.script import tirx as T

        self.spec, self.shape, self.gpu = spec, shape, gpu
        self.threads = (lambda n: T.thread_binding(n, thread="threadIdx.x")) if gpu else T.serial
        self.blocks = (lambda n: T.thread_binding(n, thread="blockIdx.x")) if gpu else T.serial
        self.shared = "shared" if gpu else "global"
        self.local = "local" if gpu else "global"  # per-thread state that lives across phases (mma body)
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

    def kernel(self, block):
        """The PrimFunc (q_src, k_src, v_src, mask, out[B, S, H, D] fp16): one thread block per
        (batch b, head h, query tile from row i0), whose work is the macro
        `block(qf, kf, vf, mf, out, b, h, i0)` (the operands as flat buffers)."""
        from tvm.script import tirx as T

        spec, loops = self.spec, self
        q, k, v, m = spec.q, spec.k, spec.v, spec.mask
        B, H, S, D, NQT = spec.batch, spec.heads, spec.seq, spec.head_dim, self.shape.query_tiles

        @T.prim_func
        def attention(q_src: T.Buffer(q.shape, q.dtype), k_src: T.Buffer(k.shape, k.dtype),
                      v_src: T.Buffer(v.shape, v.dtype), mask: T.Buffer(m.shape, m.dtype),
                      out: T.Buffer((B, S, H, D), F16)):
            T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
            qf = T.decl_buffer((q.numel(),), q.dtype, data=q_src.data)
            kf = T.decl_buffer((k.numel(),), k.dtype, data=k_src.data)
            vf = T.decl_buffer((v.numel(),), v.dtype, data=v_src.data)
            mf = T.decl_buffer((m.numel(),), m.dtype, data=mask.data)
            for bx in loops.blocks(B * H * NQT):
                b = bx // (H * NQT)
                h = bx // NQT % H
                i0 = bx % NQT * ROWS
                block(qf, kf, vf, mf, out, b, h, i0)

        # T.prim_func names every kernel after this function: `attention`, which a module then holds twice
        return attention.with_attr("global_symbol", kernel_symbol(spec, self.shape, gpu=self.gpu))
