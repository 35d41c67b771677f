"""The CUDA-core body of the fused attention (frontend.attention_kernel): any head dim.

16 threads per query row. Scores: thread (row r, key group g) computes the keys g, g + 16, ...
(16-byte loads of Q and K from shared memory, K's rows padded so that the 16 keys a half-warp reads
start in different banks), fp32 arithmetic; softmax partials through shared memory; P @ V with each
thread owning D / 16 output columns of its row.

Buffers are flat: K's padded rows stay padded (TVM compacts an N-D buffer to the columns used). P
holds the scores and E the probabilities in fp16 (as the graph's cast before P @ V has them), in
K's memory: K is read for the last time before, and rewriting P in place made TVM put a barrier
between every read and write of it.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

from .attention_spec import F16, F32, ROWS, SIMT_THREADS_PER_ROW, VECTOR, Attention, Loops, Plan


def attention_simt(spec: Attention, shape: Plan, *, gpu: bool):
    loops = Loops(spec, shape, gpu=gpu)
    D, TPR = spec.head_dim, SIMT_THREADS_PER_ROW
    c = SimpleNamespace(
        spec=spec, loops=loops, S=spec.seq, SK=spec.keys, D=D, NT=shape.threads, KP=shape.keys, TPR=TPR,
        U=shape.keys // TPR, DV=-(-D // TPR),  # keys per thread (scores), output columns per thread (P @ V)
        KROW=D + VECTOR, DC=D // VECTOR if D % VECTOR == 0 else 0)  # 16-byte chunks of a row (0: scalar loop)
    return loops.kernel(_block(c, _scores(c), _softmax(c), _context(c)))


def _block(c, scores, softmax, context):
    from tvm.script import tirx as T

    loops, spec, S, SK, D, NT, KP, TPR, KROW = c.loops, c.spec, c.S, c.SK, c.D, c.NT, c.KP, c.TPR, c.KROW
    q, k, v = spec.q, spec.k, spec.v
    VQ, VK, VV = q.vector(D), k.vector(D), v.vector(D)

    @T.macro
    def block(qf, kf, vf, mf, out, b, h, i0):
        Ks = T.alloc_buffer((KP * KROW,), F16, scope=loops.shared)
        E = T.decl_buffer((ROWS, KP), F16, data=Ks.data)
        Vs = T.alloc_buffer((KP * D,), F16, scope=loops.shared)
        Qs = T.alloc_buffer((ROWS * D,), F16, scope=loops.shared)
        P = T.alloc_buffer((ROWS, KP), F32, scope=loops.shared)
        row_max = T.alloc_buffer((ROWS, TPR), F32, scope=loops.shared)
        row_sum = T.alloc_buffer((ROWS, TPR), F32, scope=loops.shared)
        # K and V of this (b, h), Q of this tile: 16-byte loads where the layout allows
        for tx in loops.threads(NT):
            loops.load_rows(Ks, kf, k, KP, 0, SK, VK, KROW, b, h, tx)
            loops.load_rows(Vs, vf, v, KP, 0, SK, VV, D, b, h, tx)
            loops.load_rows(Qs, qf, q, ROWS, i0, S, VQ, D, b, h, tx)
        scores(Qs, Ks, P, row_max, mf, b, h, i0)
        softmax(P, E, row_max, row_sum)
        context(E, Vs, row_sum, out, b, h, i0)

    return block


def _scores(c):
    """Scores of (row r, keys kg + TPR * u) with the mask, to P; each thread's max to row_max."""
    from tvm.script import tirx as T

    loops, m, S, SK, D, NT, TPR, U, KROW, DC = c.loops, c.spec.mask, c.S, c.SK, c.D, c.NT, c.TPR, c.U, c.KROW, c.DC
    scale, neg_inf, at = float(c.spec.scale), -math.inf, c.loops.at

    @T.macro
    def scores(Qs, Ks, P, row_max, mf, b, h, i0):
        for tx in loops.threads(NT):
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

    return scores


def _softmax(c):
    """exp(score - row max) to E; each thread's sum to row_sum. A row masked everywhere (max -inf)
    gives zeros, as the where(isnan(softmax), 0, ...) of the graphs this replaces does."""
    from tvm.script import tirx as T

    loops, NT, TPR, U, neg_inf = c.loops, c.NT, c.TPR, c.U, -math.inf

    @T.macro
    def softmax(P, E, row_max, row_sum):
        for tx in loops.threads(NT):
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

    return softmax


def _context(c):
    """context = E @ V / row sum, written as [B, S, H, D]; thread (r, g) owns columns g * DV ..."""
    from tvm.script import tirx as T

    loops, S, D, NT, KP, TPR, DV = c.loops, c.S, c.D, c.NT, c.KP, c.TPR, c.DV
    # V's columns of a thread as one load where that is a CUDA vector: every column in the row (no clamp) and
    # 2, 4 or 8 halves (CUDA has no odd vectors of half: head dim 48 failed; a clamped index is no vector load
    # at all: 60 failed). Else one load per column.
    VV = DV if D % TPR == 0 and DV in (2, 4, 8) else 0

    @T.macro
    def context(E, Vs, row_sum, out, b, h, i0):
        for tx in loops.threads(NT):
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
                    if VV > 0:
                        for e in T.vectorized(VV):
                            vv[e] = Vs[(jc * VECTOR + jj) * D + tx % TPR * DV + e]
                    else:
                        for e2 in T.unroll(DV):
                            vv[e2] = Vs[(jc * VECTOR + jj) * D + T.min(tx % TPR * DV + e2, D - 1)]
                    for e in T.unroll(DV):
                        o[e] = o[e] + T.Cast(F32, ev[jj]) * T.Cast(F32, vv[e])
            if i0 + tx // TPR < S:
                for e in T.unroll(DV):
                    if tx % TPR * DV + e < D:
                        out[b, i0 + tx // TPR, h, tx % TPR * DV + e] = T.Cast(F16, T.if_then_else(
                            norm[0] > T.float32(0), o[e] / norm[0], T.float32(0)))

    return context
