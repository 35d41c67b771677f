"""The tensor-core body of the fused attention (frontend.attention_kernel): head dims that are a
multiple of 32.

Four warps per block of 16 query rows. PTX mma.sync.m16n8k16 (fp16 A row-major, B column-major,
fp32 accumulators), the fragment layout of the PTX ISA: with lane = 4 * g + t, A's element e is
(row g + 8 * (e // 2 % 2), col 2t + e % 2 + 8 * (e // 4)), B's is (k 2t + e % 2 + 8 * (e // 2),
n g), C's is (row g + 8 * (e // 2), col 2t + e % 2).
- Scores: warp w computes Q K^T for its quarter of the keys (n-tiles of 8 keys, k-chunks of 16
  head dims); the scores stay in its registers through the softmax.
- Softmax: each row's max and sum from the partials of the 16 threads that own a part of it
  (4 per warp) through shared memory; the probabilities go to shared memory in fp16 (the A
  operand of the next product; the graph this replaces casts them to fp16 there too).
- P V: warp w computes the context's output columns of its quarter of the head dim.
Rows are padded by 16 bytes in shared memory, so that the 8 rows a fragment load reads start in
different banks.
"""
from __future__ import annotations

import math

from .attention_kernel import F16, F32, MMA_WARPS, ROWS, VECTOR, Attention, Loops, Plan


def attention_mma(spec: Attention, shape: Plan, *, gpu: bool):
    from tvm.script import tirx as T

    B, H, S, SK, D = spec.batch, spec.heads, spec.seq, spec.keys, spec.head_dim
    NT, KP, NQT, W = shape.threads, shape.keys, shape.query_tiles, MMA_WARPS
    KW = KP // W                 # keys per warp (scores)
    NKT = KW // 8                # its n-tiles of 8 keys
    NDT = D // 8 // W            # n-tiles of 8 output columns per warp (P V)
    PARTS = 4 * W                # threads sharing a row: its max / sum partials
    DROW, EROW = D + VECTOR, KP + VECTOR  # padded rows: Q, K, V / the probabilities
    q, k, v, m = spec.q, spec.k, spec.v, spec.mask
    VQ, VK, VV = q.vector(D), k.vector(D), v.vector(D)
    scale = float(spec.scale)
    neg_inf = -math.inf
    loops = Loops(spec, shape, gpu=gpu)
    at = loops.at
    # The scores live in registers from the first product to the softmax: one array per thread on
    # the GPU; on the CPU, where the threads of a phase run one after the other, one row per thread.
    slots = 1 if gpu else NT

    def slot(tx):
        return 0 if gpu else tx

    @T.macro
    def scores_mma(acc, Qs, Ks, w, g, t, s):
        """acc[s, 4 n + e] = Q K^T of this thread's C elements of the warp's n-th tile of keys."""
        af = T.alloc_buffer((8,), F16, scope="local")
        bf = T.alloc_buffer((4,), F16, scope="local")
        for kc in T.serial(D // 16):
            for e in T.unroll(8):
                af[e] = Qs[(g + e % 4 // 2 * 8) * DROW + kc * 16 + t * 2 + e % 2 + e // 4 * 8]
            for n in T.unroll(NKT):
                for e in T.unroll(4):
                    bf[e] = Ks[(w * KW + n * 8 + g) * DROW + kc * 16 + t * 2 + e % 2 + e // 2 * 8]
                T.evaluate(T.ptx_legacy.mma("m16n8k16", "row", "col", "fp16", "fp16", "fp32", af.data, 0, bf.data,
                                            0, acc.data, s * NKT * 4 + n * 4, False, dtype=F32))

    @T.macro
    def scores_loops(acc, Qs, Ks, w, g, t, s):
        """The same elements as scores_mma, as dot products (the CPU variant)."""
        for n in T.serial(NKT):
            for e in T.serial(4):
                for d in T.serial(D):
                    acc[s, n * 4 + e] = acc[s, n * 4 + e] + T.Cast(F32, Qs[(g + e // 2 * 8) * DROW + d]) * T.Cast(
                        F32, Ks[(w * KW + n * 8 + t * 2 + e % 2) * DROW + d])

    @T.macro
    def context_mma(o, E, Vs, w, g, t):
        """o[4 n + e] = P V of this thread's C elements of the warp's n-th tile of output columns."""
        af = T.alloc_buffer((8,), F16, scope="local")
        bf = T.alloc_buffer((4,), F16, scope="local")
        for kc in T.serial(KP // 16):
            for e in T.unroll(8):
                af[e] = E[(g + e % 4 // 2 * 8) * EROW + kc * 16 + t * 2 + e % 2 + e // 4 * 8]
            for n in T.unroll(NDT):
                for e in T.unroll(4):
                    bf[e] = Vs[(kc * 16 + t * 2 + e % 2 + e // 2 * 8) * DROW + (w * NDT + n) * 8 + g]
                T.evaluate(T.ptx_legacy.mma("m16n8k16", "row", "col", "fp16", "fp16", "fp32", af.data, 0, bf.data,
                                            0, o.data, n * 4, False, dtype=F32))

    @T.macro
    def context_loops(o, E, Vs, w, g, t):
        for n in T.serial(NDT):
            for e in T.serial(4):
                for j in T.serial(KP):
                    o[n * 4 + e] = o[n * 4 + e] + T.Cast(F32, E[(g + e // 2 * 8) * EROW + j]) * T.Cast(
                        F32, Vs[j * DROW + (w * NDT + n) * 8 + t * 2 + e % 2])

    scores = scores_mma if gpu else scores_loops
    context = context_mma if gpu else context_loops

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
            Qs = T.alloc_buffer((ROWS * DROW,), F16, scope=loops.shared)
            Ks = T.alloc_buffer((KP * DROW,), F16, scope=loops.shared)
            E = T.decl_buffer((ROWS * EROW,), F16, data=Ks.data)  # the probabilities, once K is read
            Vs = T.alloc_buffer((KP * DROW,), F16, scope=loops.shared)
            row_max = T.alloc_buffer((ROWS * PARTS,), F32, scope=loops.shared)
            row_sum = T.alloc_buffer((ROWS * PARTS,), F32, scope=loops.shared)
            acc = T.alloc_buffer((slots, NKT * 4), F32, scope="local" if gpu else "global")
            b = bx // (H * NQT)
            h = bx // NQT % H
            i0 = bx % NQT * ROWS
            for tx in loops.threads(NT):
                loops.load_rows(Qs, qf, q, ROWS, i0, S, VQ, DROW, b, h, tx)
                loops.load_rows(Ks, kf, k, KP, 0, SK, VK, DROW, b, h, tx)
                loops.load_rows(Vs, vf, v, KP, 0, SK, VV, DROW, b, h, tx)
            # scores (scaled, masked) in registers; each thread's max of its part of rows g and g + 8
            for tx in loops.threads(NT):
                for e in T.unroll(NKT * 4):
                    acc[slot(tx), e] = T.float32(0)
                scores(acc, Qs, Ks, tx // 32, tx % 32 // 4, tx % 4, slot(tx))
                best = T.alloc_buffer((2,), F32, scope="local")
                best[0] = T.float32(neg_inf)
                best[1] = T.float32(neg_inf)
                for n in T.unroll(NKT):
                    for e in T.unroll(4):
                        acc[slot(tx), n * 4 + e] = T.if_then_else(
                            tx // 32 * KW + n * 8 + tx % 4 * 2 + e % 2 < SK,
                            acc[slot(tx), n * 4 + e] * T.float32(scale) + T.Cast(F32, mf[at(
                                m, b, h, T.min(i0 + tx % 32 // 4 + e // 2 * 8, S - 1),
                                T.min(tx // 32 * KW + n * 8 + tx % 4 * 2 + e % 2, SK - 1))]),
                            T.float32(neg_inf))
                        best[e // 2] = T.max(best[e // 2], acc[slot(tx), n * 4 + e])
                for half in T.unroll(2):
                    row_max[(tx % 32 // 4 + half * 8) * PARTS + tx // 32 * 4 + tx % 4] = best[half]
            # exp(score - row max) to E in fp16; each thread's sums. A row masked everywhere (max -inf)
            # gives zeros, as the where(isnan(softmax), 0, ...) of the graphs this replaces does.
            for tx in loops.threads(NT):
                mx = T.alloc_buffer((2,), F32, scope="local")
                total = T.alloc_buffer((2,), F32, scope="local")
                for half in T.unroll(2):
                    mx[half] = T.float32(neg_inf)
                    for p in T.serial(PARTS):
                        mx[half] = T.max(mx[half], row_max[(tx % 32 // 4 + half * 8) * PARTS + p])
                    if mx[half] == T.float32(neg_inf):
                        mx[half] = T.float32(0)
                    total[half] = T.float32(0)
                for n in T.unroll(NKT):
                    for e in T.unroll(4):
                        E[(tx % 32 // 4 + e // 2 * 8) * EROW + tx // 32 * KW + n * 8 + tx % 4 * 2 + e % 2] = T.Cast(
                            F16, T.exp(acc[slot(tx), n * 4 + e] - mx[e // 2]))
                        total[e // 2] = total[e // 2] + T.exp(acc[slot(tx), n * 4 + e] - mx[e // 2])
                for half in T.unroll(2):
                    row_sum[(tx % 32 // 4 + half * 8) * PARTS + tx // 32 * 4 + tx % 4] = total[half]
            # context = E V / row sum, written as [B, S, H, D]
            for tx in loops.threads(NT):
                o = T.alloc_buffer((NDT * 4,), F32, scope="local")
                norm = T.alloc_buffer((2,), F32, scope="local")
                for e in T.unroll(NDT * 4):
                    o[e] = T.float32(0)
                context(o, E, Vs, tx // 32, tx % 32 // 4, tx % 4)
                for half in T.unroll(2):
                    norm[half] = T.float32(0)
                    for p in T.serial(PARTS):
                        norm[half] = norm[half] + row_sum[(tx % 32 // 4 + half * 8) * PARTS + p]
                for n in T.unroll(NDT):
                    for e in T.unroll(4):
                        if i0 + tx % 32 // 4 + e // 2 * 8 < S:
                            out[b, i0 + tx % 32 // 4 + e // 2 * 8, h, (tx // 32 * NDT + n) * 8 + tx % 4 * 2 + e % 2] = \
                                T.Cast(F16, T.if_then_else(norm[e // 2] > T.float32(0), o[n * 4 + e] / norm[e // 2],
                                                           T.float32(0)))

    return attention
