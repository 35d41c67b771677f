"""One CUDA kernel for a whole scaled-dot-product attention: scores, mask, softmax and P @ V.

Unfused, a transformer layer's attention at batch 1 is seven launches (Q/K/V and context
transposes, the two matmuls, softmax) of 3-7 µs each at a 40% share, all launch-bound:
BERT-base spends ~320 µs of its ~1 ms there at 40% of an H100. This kernel reads Q, K and V
where they already are (the combined QKV projection's output, by strides), keeps K, V and the
block's scores in shared memory, and writes the context in [B, S, H, D], which is what the output
projection reads after a reshape that costs nothing.

One thread block per (batch, head, tile of ROWS query rows); 16 threads per query row; fp16 loads,
fp32 arithmetic. It is written by hand (`tirx.is_scheduled`: MetaSchedule and DLight leave it
alone) because MetaSchedule's rules never put several reductions into one kernel. Everything that
must fit in shared memory does for BERT-base (seq 128, head dim 64: ~45 KB); `plan` says None for
shapes that do not fit, and those keep the unfused graph.

`attention_kernel(..., gpu=False)` is the same loop nest with serial loops in place of the thread
bindings (each phase's loop over threads runs to the end before the next starts, as the barrier
between them ensures on the GPU), so its arithmetic and indexing can be checked on a CPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

F16, F32 = "float16", "float32"
ROWS = 16            # query rows per thread block
THREADS_PER_ROW = 16
VECTOR = 8           # fp16 elements per 16-byte load
SHARED_LIMIT = 48 * 1024  # static shared memory per block (what TVM's CUDA codegen declares)


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
    threads: int
    keys_per_thread: int   # scores each thread computes (keys padded to THREADS_PER_ROW * this)
    dims_per_thread: int   # output columns each thread accumulates
    query_tiles: int
    shared_bytes: int


def plan(spec: Attention) -> Plan | None:
    """The launch shape of `spec`'s kernel, or None when its K, V and scores do not fit a block."""
    keys_per_thread = -(-spec.keys // THREADS_PER_ROW)
    padded = keys_per_thread * THREADS_PER_ROW
    d = spec.head_dim
    # K (padded rows; the fp16 probabilities reuse it once the scores are made), V and Q in fp16;
    # scores and the row max / sum partials in fp32
    shared = (max(padded * (d + VECTOR), ROWS * padded) * 2 + padded * d * 2 + ROWS * d * 2
              + ROWS * padded * 4 + 2 * ROWS * THREADS_PER_ROW * 4)
    if shared > SHARED_LIMIT:
        return None
    return Plan(ROWS * THREADS_PER_ROW, keys_per_thread, -(-d // THREADS_PER_ROW), -(-spec.seq // ROWS), shared)


def attention_kernel(spec: Attention, *, gpu: bool = True):
    """The PrimFunc (q_src, k_src, v_src, mask, out[B, S, H, D] fp16) for `spec` (module doc)."""
    from tvm.script import tirx as T

    shape = plan(spec)
    if shape is None:
        raise ValueError("attention does not fit one thread block's shared memory")
    B, H, S, SK, D = spec.batch, spec.heads, spec.seq, spec.keys, spec.head_dim
    NT, U, DV, NQT = shape.threads, shape.keys_per_thread, shape.dims_per_thread, shape.query_tiles
    TPR, KP = THREADS_PER_ROW, shape.keys_per_thread * THREADS_PER_ROW
    q, k, v, m = spec.q, spec.k, spec.v, spec.mask
    VQ, VK, VV = q.vector(D), k.vector(D), v.vector(D)
    KROW = D + VECTOR  # K's rows padded by 16 bytes: the 16 keys a half-warp reads start in different banks
    DC = D // VECTOR if D % VECTOR == 0 else 0  # 16-byte chunks of a row in the score loop (0: scalar loop)
    scale = float(spec.scale)
    neg_inf = -math.inf

    threads = (lambda n: T.thread_binding(n, thread="threadIdx.x")) if gpu else T.serial
    blocks = (lambda n: T.thread_binding(n, thread="blockIdx.x")) if gpu else T.serial
    shared = "shared" if gpu else "global"

    def at(op: Operand, b, h, s, d):
        sb, sh, ss, sd = op.strides
        return op.offset + b * sb + h * sh + s * ss + d * sd

    @T.macro
    def load_rows(dst, src, op, count, first, valid, vec, row_stride, b, h, tx):
        """dst's rows 0..count-1 = rows first..first+count-1 of operand `op` (zeros past `valid`)."""
        for it in T.serial(-(-(count * D // vec) // NT)):
            c = it * NT + tx
            if c < count * D // vec:
                for e in T.vectorized(vec):
                    dst[c // (D // vec) * row_stride + c % (D // vec) * vec + e] = T.if_then_else(
                        first + c // (D // vec) < valid, src[at(op, b, h, first + c // (D // vec), c % (D // vec) * vec + e)],
                        T.float16(0))

    @T.prim_func
    def attention(q_src: T.Buffer(q.shape, q.dtype), k_src: T.Buffer(k.shape, k.dtype),
                  v_src: T.Buffer(v.shape, v.dtype), mask: T.Buffer(m.shape, m.dtype),
                  out: T.Buffer((B, S, H, D), F16)):
        T.func_attr({"tirx.is_scheduled": True, "tirx.noalias": True})
        qf = T.decl_buffer((q.numel(),), q.dtype, data=q_src.data)
        kf = T.decl_buffer((k.numel(),), k.dtype, data=k_src.data)
        vf = T.decl_buffer((v.numel(),), v.dtype, data=v_src.data)
        mf = T.decl_buffer((m.numel(),), m.dtype, data=mask.data)
        for bx in blocks(B * H * NQT):
            # Flat buffers: K's padded rows stay padded (TVM compacts an N-D buffer to the columns
            # used); P holds the scores, E the probabilities in fp16, as the graph's
            # cast before P @ V has them, in K's memory (K is read for the last time before; and
            # rewriting P in place made TVM put a barrier between every read and write of it)
            Ks = T.alloc_buffer((KP * KROW,), F16, scope=shared)
            E = T.decl_buffer((ROWS, KP), F16, data=Ks.data)
            Vs = T.alloc_buffer((KP * D,), F16, scope=shared)
            Qs = T.alloc_buffer((ROWS * D,), F16, scope=shared)
            P = T.alloc_buffer((ROWS, KP), F32, scope=shared)
            row_max = T.alloc_buffer((ROWS, TPR), F32, scope=shared)
            row_sum = T.alloc_buffer((ROWS, TPR), F32, scope=shared)
            b = bx // (H * NQT)
            h = bx // NQT % H
            i0 = bx % NQT * ROWS
            # K and V of this (b, h), Q of this tile: 16-byte loads where the layout allows
            for tx in threads(NT):
                load_rows(Ks, kf, k, KP, 0, SK, VK, KROW, b, h, tx)
                load_rows(Vs, vf, v, KP, 0, SK, VV, D, b, h, tx)
                load_rows(Qs, qf, q, ROWS, i0, S, VQ, D, b, h, tx)
            # scores of (row r, keys kg + TPR * u), with the mask; each thread's max to row_max
            for tx in threads(NT):
                acc = T.alloc_buffer((U,), F32, scope="local")
                for u in T.unroll(U):
                    acc[u] = T.float32(0)
                if DC > 0:
                    qv = T.alloc_buffer((VECTOR,), F16, scope="local")
                    qw = T.alloc_buffer((VECTOR,), F32, scope="local")
                    kv = T.alloc_buffer((VECTOR,), F16, scope="local")
                    for dc in T.serial(DC):
                        for e in T.vectorized(VECTOR):
                            qv[e] = Qs[tx // TPR * D + dc * VECTOR + e]
                        for e in T.unroll(VECTOR):
                            qw[e] = T.Cast(F32, qv[e])
                        for u in T.unroll(U):
                            for e in T.vectorized(VECTOR):
                                kv[e] = Ks[(tx % TPR + u * TPR) * KROW + dc * VECTOR + e]
                            for e in T.unroll(VECTOR):
                                acc[u] = acc[u] + qw[e] * T.Cast(F32, kv[e])
                else:
                    for d in T.serial(D):
                        for u in T.unroll(U):
                            acc[u] = acc[u] + T.Cast(F32, Qs[tx // TPR * D + d]) * T.Cast(
                                F32, Ks[(tx % TPR + u * TPR) * KROW + d])
                best = T.alloc_buffer((1,), F32, scope="local")
                best[0] = T.float32(neg_inf)
                for u in T.unroll(U):
                    score = T.if_then_else(tx % TPR + u * TPR < SK, acc[u] * T.float32(scale) + T.Cast(
                        F32, mf[at(m, b, h, T.min(i0 + tx // TPR, S - 1), T.min(tx % TPR + u * TPR, SK - 1))]),
                        T.float32(neg_inf))
                    P[tx // TPR, tx % TPR + u * TPR] = score
                    best[0] = T.max(best[0], score)
                row_max[tx // TPR, tx % TPR] = best[0]
            # exp(score - row max) to E; each thread's sum to row_sum. A row masked everywhere (max
            # -inf) gives zeros, as the where(isnan(softmax), 0, ...) of the graphs this replaces does.
            for tx in threads(NT):
                mx = T.alloc_buffer((1,), F32, scope="local")
                total = T.alloc_buffer((1,), F32, scope="local")
                mx[0] = T.float32(neg_inf)
                for t in T.serial(TPR):
                    mx[0] = T.max(mx[0], row_max[tx // TPR, t])
                if mx[0] == T.float32(neg_inf):
                    mx[0] = T.float32(0)
                total[0] = T.float32(0)
                for u in T.unroll(U):
                    p = T.exp(P[tx // TPR, tx % TPR + u * TPR] - mx[0])
                    E[tx // TPR, tx % TPR + u * TPR] = T.Cast(F16, p)
                    total[0] = total[0] + p
                row_sum[tx // TPR, tx % TPR] = total[0]
            # context = E @ V / row sum; thread (r, g) owns columns g * DV ... g * DV + DV - 1
            for tx in threads(NT):
                o = T.alloc_buffer((DV,), F32, scope="local")
                ev = T.alloc_buffer((VECTOR,), F16, scope="local")
                vv = T.alloc_buffer((DV,), F16, scope="local")
                norm = T.alloc_buffer((1,), F32, scope="local")
                norm[0] = T.float32(0)
                for t in T.serial(TPR):
                    norm[0] = norm[0] + row_sum[tx // TPR, t]
                for e in T.unroll(DV):
                    o[e] = T.float32(0)
                for jc in T.serial(KP // VECTOR):
                    for e in T.vectorized(VECTOR):
                        ev[e] = E[tx // TPR, jc * VECTOR + e]
                    for jj in T.unroll(VECTOR):
                        for e in T.vectorized(DV):
                            vv[e] = Vs[(jc * VECTOR + jj) * D + T.min(tx % TPR * DV + e, D - 1)]
                        for e in T.unroll(DV):
                            o[e] = o[e] + T.Cast(F32, ev[jj]) * T.Cast(F32, vv[e])
                if i0 + tx // TPR < S:
                    for e in T.unroll(DV):
                        if tx % TPR * DV + e < D:
                            out[b, i0 + tx // TPR, h, tx % TPR * DV + e] = T.Cast(F16, T.if_then_else(
                                norm[0] > T.float32(0), o[e] / norm[0], T.float32(0)))

    return attention
