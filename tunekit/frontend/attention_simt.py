"""The CUDA-core body of the fused attention (frontend.attention_kernel): any head dim.

16 threads per query row. Scores: thread (row r, key group g) computes the keys g, g + 16, ...
(16-byte loads of Q and K from shared memory, K's rows padded so that the 16 keys a half-warp reads
start in different banks), fp32 arithmetic; softmax partials through shared memory; P @ V with each
thread owning D / 16 output columns of its row.
"""
from __future__ import annotations

import math

from .attention_kernel import F16, F32, ROWS, SIMT_THREADS_PER_ROW, VECTOR, Attention, Loops, Plan


def attention_simt(spec: Attention, shape: Plan, *, gpu: bool):
    from tvm.script import tirx as T

    B, H, S, SK, D = spec.batch, spec.heads, spec.seq, spec.keys, spec.head_dim
    NT, KP, NQT, TPR = shape.threads, shape.keys, shape.query_tiles, SIMT_THREADS_PER_ROW
    U, DV = KP // TPR, -(-D // TPR)  # keys per thread (scores), output columns per thread (P @ V)
    q, k, v, m = spec.q, spec.k, spec.v, spec.mask
    VQ, VK, VV = q.vector(D), k.vector(D), v.vector(D)
    KROW = D + VECTOR  # K's rows padded by 16 bytes: the 16 keys a half-warp reads start in different banks
    DC = D // VECTOR if D % VECTOR == 0 else 0  # 16-byte chunks of a row in the score loop (0: scalar loop)
    scale = float(spec.scale)
    neg_inf = -math.inf
    loops = Loops(spec, shape, gpu=gpu)
    at = loops.at

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
            # Flat buffers: K's padded rows stay padded (TVM compacts an N-D buffer to the columns
            # used); P holds the scores, E the probabilities in fp16, as the graph's
            # cast before P @ V has them, in K's memory (K is read for the last time before; and
            # rewriting P in place made TVM put a barrier between every read and write of it)
            Ks = T.alloc_buffer((KP * KROW,), F16, scope=loops.shared)
            E = T.decl_buffer((ROWS, KP), F16, data=Ks.data)
            Vs = T.alloc_buffer((KP * D,), F16, scope=loops.shared)
            Qs = T.alloc_buffer((ROWS * D,), F16, scope=loops.shared)
            P = T.alloc_buffer((ROWS, KP), F32, scope=loops.shared)
            row_max = T.alloc_buffer((ROWS, TPR), F32, scope=loops.shared)
            row_sum = T.alloc_buffer((ROWS, TPR), F32, scope=loops.shared)
            b = bx // (H * NQT)
            h = bx // NQT % H
            i0 = bx % NQT * ROWS
            # K and V of this (b, h), Q of this tile: 16-byte loads where the layout allows
            for tx in loops.threads(NT):
                loops.load_rows(Ks, kf, k, KP, 0, SK, VK, KROW, b, h, tx)
                loops.load_rows(Vs, vf, v, KP, 0, SK, VV, D, b, h, tx)
                loops.load_rows(Qs, qf, q, ROWS, i0, S, VQ, D, b, h, tx)
            # scores of (row r, keys kg + TPR * u), with the mask; each thread's max to row_max
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
            # exp(score - row max) to E; each thread's sum to row_sum. A row masked everywhere (max
            # -inf) gives zeros, as the where(isnan(softmax), 0, ...) of the graphs this replaces does.
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
            # context = E @ V / row sum; thread (r, g) owns columns g * DV ... g * DV + DV - 1
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
