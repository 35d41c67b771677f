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
from types import SimpleNamespace

from .attention_spec import F16, F32, MMA_WARPS, ROWS, VECTOR, Attention, Loops, Plan


def attention_mma(spec: Attention, shape: Plan, *, gpu: bool):
    loops = Loops(spec, shape, gpu=gpu)
    D, KP, W = spec.head_dim, shape.keys, MMA_WARPS
    c = SimpleNamespace(
        spec=spec, loops=loops, gpu=gpu, S=spec.seq, SK=spec.keys, D=D, NT=shape.threads, KP=KP,
        KW=KP // W,              # keys per warp (scores)
        NKT=KP // W // 8,        # its n-tiles of 8 keys
        NDT=D // 8 // W,         # n-tiles of 8 output columns per warp (P V)
        PARTS=4 * W,             # threads sharing a row: its max / sum partials
        DROW=D + VECTOR, EROW=KP + VECTOR,  # padded rows: Q, K, V / the probabilities
        # The scores live in registers from the first product to the softmax: one array per thread on
        # the GPU; on the CPU, where the threads of a phase run one after the other, one row per thread.
        slots=1 if gpu else shape.threads)
    products = products_mma(c) if gpu else products_loops(c)
    return loops.kernel(_block(c, scaled_scores(c, products[0]), _softmax(c), _context(c, products[1])))


def slot_of(c):
    """A thread's row of per-thread state that lives across phases: its own registers on the GPU (one row), row tx
    on the CPU (the threads of a phase run one after the other)."""
    return (lambda tx: 0) if c.gpu else (lambda tx: tx)


def _block(c, scores, softmax, context):
    from tvm.script import tirx as T

    loops, spec, S, SK, D, NT, KP, DROW, EROW, PARTS = (c.loops, c.spec, c.S, c.SK, c.D, c.NT, c.KP, c.DROW, c.EROW,
                                                        c.PARTS)
    q, k, v, NKT, slots = spec.q, spec.k, spec.v, c.NKT, c.slots
    VQ, VK, VV = q.vector(D), k.vector(D), v.vector(D)

    @T.macro
    def block(qf, kf, vf, mf, out, b, h, i0):
        Qs = T.alloc_buffer((ROWS * DROW,), F16, scope=loops.shared)
        Ks = T.alloc_buffer((KP * DROW,), F16, scope=loops.shared)
        E = T.decl_buffer((ROWS * EROW,), F16, data=Ks.data)  # the probabilities, once K is read
        Vs = T.alloc_buffer((KP * DROW,), F16, scope=loops.shared)
        row_max = T.alloc_buffer((ROWS * PARTS,), F32, scope=loops.shared)
        row_sum = T.alloc_buffer((ROWS * PARTS,), F32, scope=loops.shared)
        acc = T.alloc_buffer((slots, NKT * 4), F32, scope=loops.local)
        for tx in loops.threads(NT):
            loops.load_rows(Qs, qf, q, ROWS, i0, S, VQ, DROW, b, h, tx)
            loops.load_rows(Ks, kf, k, KP, 0, SK, VK, DROW, b, h, tx)
            loops.load_rows(Vs, vf, v, KP, 0, SK, VV, DROW, b, h, tx)
        scores(Qs, Ks, acc, row_max, mf, b, h, i0, 0)
        softmax(acc, E, row_max, row_sum)
        context(E, Vs, row_sum, out, b, h, i0)

    return block


def products_mma(c):
    """(Q K^T, E V) on tensor cores: per thread, its C elements of the warp's n-tiles, accumulated into row `s` of
    its accumulator (c.KP keys: all of them, or one key tile of frontend.attention_flash)."""
    from tvm.script import tirx as T

    D, KP, KW, NKT, NDT, DROW, EROW = c.D, c.KP, c.KW, c.NKT, c.NDT, c.DROW, c.EROW

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
    def context_mma(o, E, Vs, w, g, t, s):
        """o[s, 4 n + e] += P V of this thread's C elements of the warp's n-th tile of output columns."""
        af = T.alloc_buffer((8,), F16, scope="local")
        bf = T.alloc_buffer((4,), F16, scope="local")
        for kc in T.serial(KP // 16):
            for e in T.unroll(8):
                af[e] = E[(g + e % 4 // 2 * 8) * EROW + kc * 16 + t * 2 + e % 2 + e // 4 * 8]
            for n in T.unroll(NDT):
                for e in T.unroll(4):
                    bf[e] = Vs[(kc * 16 + t * 2 + e % 2 + e // 2 * 8) * DROW + (w * NDT + n) * 8 + g]
                T.evaluate(T.ptx_legacy.mma("m16n8k16", "row", "col", "fp16", "fp16", "fp32", af.data, 0, bf.data,
                                            0, o.data, s * NDT * 4 + n * 4, False, dtype=F32))

    return scores_mma, context_mma


def products_loops(c):
    """The same elements as products_mma, as dot products (the CPU variant)."""
    from tvm.script import tirx as T

    D, KP, KW, NKT, NDT, DROW, EROW = c.D, c.KP, c.KW, c.NKT, c.NDT, c.DROW, c.EROW

    @T.macro
    def scores_loops(acc, Qs, Ks, w, g, t, s):
        for n in T.serial(NKT):
            for e in T.serial(4):
                for d in T.serial(D):
                    acc[s, n * 4 + e] = acc[s, n * 4 + e] + T.Cast(F32, Qs[(g + e // 2 * 8) * DROW + d]) * T.Cast(
                        F32, Ks[(w * KW + n * 8 + t * 2 + e % 2) * DROW + d])

    @T.macro
    def context_loops(o, E, Vs, w, g, t, s):
        for n in T.serial(NDT):
            for e in T.serial(4):
                for j in T.serial(KP):
                    o[s, n * 4 + e] = o[s, n * 4 + e] + T.Cast(F32, E[(g + e // 2 * 8) * EROW + j]) * T.Cast(
                        F32, Vs[j * DROW + (w * NDT + n) * 8 + t * 2 + e % 2])

    return scores_loops, context_loops


def scaled_scores(c, product):
    """Scores (scaled, masked) of the c.KP keys from key j0 in registers; each thread's max of its part of rows g and
    g + 8 to row_max."""
    from tvm.script import tirx as T

    loops, m, S, SK, NT, KW, NKT, PARTS = c.loops, c.spec.mask, c.S, c.SK, c.NT, c.KW, c.NKT, c.PARTS
    scale, neg_inf, at, slot = float(c.spec.scale), -math.inf, c.loops.at, slot_of(c)

    @T.macro
    def scores(Qs, Ks, acc, row_max, mf, b, h, i0, j0):
        for tx in loops.threads(NT):
            for e in T.unroll(NKT * 4):
                acc[slot(tx), e] = T.float32(0)
            product(acc, Qs, Ks, tx // 32, tx % 32 // 4, tx % 4, slot(tx))
            best = T.alloc_buffer((2,), F32, scope="local")
            best[0] = T.float32(neg_inf)
            best[1] = T.float32(neg_inf)
            for n in T.unroll(NKT):
                for e in T.unroll(4):
                    acc[slot(tx), n * 4 + e] = T.if_then_else(
                        j0 + tx // 32 * KW + n * 8 + tx % 4 * 2 + e % 2 < SK,
                        acc[slot(tx), n * 4 + e] * T.float32(scale) + T.Cast(F32, mf[at(
                            m, b, h, T.min(i0 + tx % 32 // 4 + e // 2 * 8, S - 1),
                            T.min(j0 + tx // 32 * KW + n * 8 + tx % 4 * 2 + e % 2, SK - 1))]),
                        T.float32(neg_inf))
                    best[e // 2] = T.max(best[e // 2], acc[slot(tx), n * 4 + e])
            for half in T.unroll(2):
                row_max[(tx % 32 // 4 + half * 8) * PARTS + tx // 32 * 4 + tx % 4] = best[half]

    return scores


def _softmax(c):
    """exp(score - row max) to E in fp16; each thread's sums. A row masked everywhere (max -inf)
    gives zeros, as the where(isnan(softmax), 0, ...) of the graphs this replaces does."""
    from tvm.script import tirx as T

    loops, NT, PARTS, neg_inf, exps = c.loops, c.NT, c.PARTS, -math.inf, probabilities(c)

    @T.macro
    def softmax(acc, E, row_max, row_sum):
        for tx in loops.threads(NT):
            mx = T.alloc_buffer((2,), F32, scope="local")
            for half in T.unroll(2):
                mx[half] = T.float32(neg_inf)
                for p in T.serial(PARTS):
                    mx[half] = T.max(mx[half], row_max[(tx % 32 // 4 + half * 8) * PARTS + p])
                if mx[half] == T.float32(neg_inf):
                    mx[half] = T.float32(0)
            exps(acc, E, row_sum, mx, tx)

    return softmax


def probabilities(c):
    """E = exp(score - base of its row) in fp16 (the A operand of P V), and each thread's sums of its part of rows
    g and g + 8 to row_sum, from the scores in its registers."""
    from tvm.script import tirx as T

    KW, NKT, PARTS, EROW, slot = c.KW, c.NKT, c.PARTS, c.EROW, slot_of(c)

    @T.macro
    def exps(acc, E, row_sum, base, tx):
        total = T.alloc_buffer((2,), F32, scope="local")
        total[0] = T.float32(0)
        total[1] = T.float32(0)
        for n in T.unroll(NKT):
            for e in T.unroll(4):
                E[(tx % 32 // 4 + e // 2 * 8) * EROW + tx // 32 * KW + n * 8 + tx % 4 * 2 + e % 2] = T.Cast(
                    F16, T.exp(acc[slot(tx), n * 4 + e] - base[e // 2]))
                total[e // 2] = total[e // 2] + T.exp(acc[slot(tx), n * 4 + e] - base[e // 2])
        for half in T.unroll(2):
            row_sum[(tx % 32 // 4 + half * 8) * PARTS + tx // 32 * 4 + tx % 4] = total[half]

    return exps


def _context(c, product):
    """context = E V / row sum, written as [B, S, H, D]."""
    from tvm.script import tirx as T

    loops, S, NT, NDT, PARTS = c.loops, c.S, c.NT, c.NDT, c.PARTS

    @T.macro
    def context(E, Vs, row_sum, out, b, h, i0):
        for tx in loops.threads(NT):
            o = T.alloc_buffer((1, NDT * 4), F32, scope="local")
            norm = T.alloc_buffer((2,), F32, scope="local")
            for e in T.unroll(NDT * 4):
                o[0, e] = T.float32(0)
            product(o, E, Vs, tx // 32, tx % 32 // 4, tx % 4, 0)
            for half in T.unroll(2):
                norm[half] = T.float32(0)
                for p in T.serial(PARTS):
                    norm[half] = norm[half] + row_sum[(tx % 32 // 4 + half * 8) * PARTS + p]
            for n in T.unroll(NDT):
                for e in T.unroll(4):
                    if i0 + tx % 32 // 4 + e // 2 * 8 < S:
                        out[b, i0 + tx % 32 // 4 + e // 2 * 8, h, (tx // 32 * NDT + n) * 8 + tx % 4 * 2 + e % 2] = \
                            T.Cast(F16, T.if_then_else(norm[e // 2] > T.float32(0), o[0, n * 4 + e] / norm[e // 2],
                                                       T.float32(0)))

    return context
