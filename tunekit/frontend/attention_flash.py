"""The key-tiled tensor-core body of the fused attention (frontend.attention_kernel): attention whose K and V do
not fit a block's shared memory at once (ViT-B/16's 197 keys, BERT's or GPT-2's 512), head dims a multiple of 16.

The keys go through shared memory a tile of `key_tile` at a time, with the softmax online (flash attention): each
query row keeps a running max m and sum l; a tile's scores give the new max m' = max(m, the tile's max), the output
accumulated so far and l are scaled by exp(m - m'), and the tile's exp(s - m') V and sum are added. The products of
one tile are attention_mma's (mma.sync m16n8k16, four warps), over the tile's keys.

A head dim that is no multiple of 32 (80) is padded with zero columns in shared memory to the next one (96): the
padding adds nothing to the scores, and the output columns it makes are not written.

Per-thread state that lives across the phases of a tile and across tiles (the running max and sum of its two rows,
its output accumulators) is one row of a buffer: its registers on the GPU, row tx on the CPU (attention_mma.slot_of).
All threads of a row derive its max from the same partials in the same order, so they agree without a broadcast.
"""
from __future__ import annotations

import math
from types import SimpleNamespace

from .attention_mma import probabilities, products_loops, products_mma, scaled_scores, slot_of
from .attention_spec import F16, F32, MMA_WARPS, ROWS, VECTOR, Attention, Loops, Plan, padded_head_dim


def attention_flash(spec: Attention, shape: Plan, *, gpu: bool):
    loops = Loops(spec, shape, gpu=gpu)
    D, KT, W = padded_head_dim(spec.head_dim), shape.key_tile, MMA_WARPS  # the products' D; loads fill spec's
    c = SimpleNamespace(
        spec=spec, loops=loops, gpu=gpu, S=spec.seq, SK=spec.keys, D=D, NT=shape.threads, KP=KT,
        KW=KT // W, NKT=KT // W // 8, NDT=D // 8 // W, PARTS=4 * W, DROW=D + VECTOR, EROW=KT + VECTOR,
        TILES=-(-spec.keys // KT), slots=1 if gpu else shape.threads)
    products = products_mma(c) if gpu else products_loops(c)
    return loops.kernel(_block(c, scaled_scores(c, products[0]), _softmax(c), _context(c, products[1]), _write(c)))


def _block(c, scores, softmax, context, write):
    from tvm.script import tirx as T

    loops, spec, S, SK, D, NT, KT, DROW, EROW, PARTS = (c.loops, c.spec, c.S, c.SK, c.D, c.NT, c.KP, c.DROW, c.EROW,
                                                        c.PARTS)
    q, k, v, NKT, NDT, TILES, slots, slot = spec.q, spec.k, spec.v, c.NKT, c.NDT, c.TILES, c.slots, slot_of(c)
    HD = spec.head_dim  # what the operands hold; D is what the products read, HD <= D
    VQ, VK, VV = q.vector(HD), k.vector(HD), v.vector(HD)
    PAD, neg_inf = D - HD, -math.inf

    @T.macro
    def zero_pads(buf, rows, tx):
        """Columns HD..D-1 of `rows` rows of `buf`: zeros (the products read them)."""
        if PAD > 0:
            for it in T.serial(-(-(rows * PAD) // NT)):
                if it * NT + tx < rows * PAD:
                    buf[(it * NT + tx) // PAD * DROW + HD + (it * NT + tx) % PAD] = T.float16(0)

    @T.macro
    def block(qf, kf, vf, mf, out, b, h, i0):
        Qs = T.alloc_buffer((ROWS * DROW,), F16, scope=loops.shared)
        Ks = T.alloc_buffer((KT * DROW,), F16, scope=loops.shared)
        E = T.decl_buffer((ROWS * EROW,), F16, data=Ks.data)  # the tile's probabilities, once its K is read
        Vs = T.alloc_buffer((KT * DROW,), F16, scope=loops.shared)
        row_max = T.alloc_buffer((ROWS * PARTS,), F32, scope=loops.shared)
        row_sum = T.alloc_buffer((ROWS * PARTS,), F32, scope=loops.shared)
        acc = T.alloc_buffer((slots, NKT * 4), F32, scope=loops.local)  # the tile's scores
        o = T.alloc_buffer((slots, NDT * 4), F32, scope=loops.local)    # the output so far, unnormalized
        run = T.alloc_buffer((slots, 4), F32, scope=loops.local)        # max of rows g, g + 8; their sums
        rescale = T.alloc_buffer((slots, 2), F32, scope=loops.local)    # exp(old max - new max) of this tile
        for tx in loops.threads(NT):
            loops.load_rows(Qs, qf, q, ROWS, i0, S, VQ, DROW, b, h, tx)
            zero_pads(Qs, ROWS, tx)
            for e in T.unroll(NDT * 4):
                o[slot(tx), e] = T.float32(0)
            for half in T.unroll(2):
                run[slot(tx), half] = T.float32(neg_inf)
                run[slot(tx), 2 + half] = T.float32(0)
        for jt in T.serial(TILES):
            for tx in loops.threads(NT):
                loops.load_rows(Ks, kf, k, KT, jt * KT, SK, VK, DROW, b, h, tx)
                loops.load_rows(Vs, vf, v, KT, jt * KT, SK, VV, DROW, b, h, tx)
                zero_pads(Ks, KT, tx)  # again each tile: the last tile's probabilities were written over them
                zero_pads(Vs, KT, tx)
            scores(Qs, Ks, acc, row_max, mf, b, h, i0, jt * KT)
            softmax(acc, E, row_max, row_sum, run, rescale)
            context(E, Vs, o, row_sum, run, rescale)
        write(o, run, out, b, h, i0)

    return block


def _softmax(c):
    """The new running max of each row, exp(score - it) to E in fp16, each thread's sums of the tile, and the
    factor that carries the earlier tiles over to the new max. While a row has seen only masked keys (max -inf),
    its exps are taken against 0, so they are zeros, as the where(isnan(softmax), 0, ...) of the graphs this
    replaces gives."""
    from tvm.script import tirx as T

    loops, NT, PARTS, neg_inf, slot, exps = c.loops, c.NT, c.PARTS, -math.inf, slot_of(c), probabilities(c)

    @T.macro
    def softmax(acc, E, row_max, row_sum, run, rescale):
        for tx in loops.threads(NT):
            mx = T.alloc_buffer((2,), F32, scope="local")
            base = T.alloc_buffer((2,), F32, scope="local")
            for half in T.unroll(2):
                mx[half] = run[slot(tx), half]
                for p in T.serial(PARTS):
                    mx[half] = T.max(mx[half], row_max[(tx % 32 // 4 + half * 8) * PARTS + p])
                base[half] = T.if_then_else(mx[half] == T.float32(neg_inf), T.float32(0), mx[half])
                rescale[slot(tx), half] = T.exp(run[slot(tx), half] - base[half])  # exp(-inf) = 0: nothing yet
                run[slot(tx), half] = mx[half]
            exps(acc, E, row_sum, base, tx)

    return softmax


def _context(c, product):
    """The output so far and the running sums carried over to the new max, then the tile's E V added."""
    from tvm.script import tirx as T

    loops, NT, NDT, PARTS, slot = c.loops, c.NT, c.NDT, c.PARTS, slot_of(c)

    @T.macro
    def context(E, Vs, o, row_sum, run, rescale):
        for tx in loops.threads(NT):
            for half in T.unroll(2):
                tile_sum = T.alloc_buffer((1,), F32, scope="local")
                tile_sum[0] = T.float32(0)
                for p in T.serial(PARTS):
                    tile_sum[0] = tile_sum[0] + row_sum[(tx % 32 // 4 + half * 8) * PARTS + p]
                run[slot(tx), 2 + half] = run[slot(tx), 2 + half] * rescale[slot(tx), half] + tile_sum[0]
            for n in T.unroll(NDT):
                for e in T.unroll(4):
                    o[slot(tx), n * 4 + e] = o[slot(tx), n * 4 + e] * rescale[slot(tx), e // 2]
            product(o, E, Vs, tx // 32, tx % 32 // 4, tx % 4, slot(tx))

    return context


def _write(c):
    """context = o / l, written as [B, S, H, D]; a row masked everywhere (l = 0) gives zeros."""
    from tvm.script import tirx as T

    loops, S, NT, NDT, HD, slot = c.loops, c.S, c.NT, c.NDT, c.spec.head_dim, slot_of(c)

    @T.macro
    def write(o, run, out, b, h, i0):
        for tx in loops.threads(NT):
            for n in T.unroll(NDT):
                for e in T.unroll(4):
                    if i0 + tx % 32 // 4 + e // 2 * 8 < S and (tx // 32 * NDT + n) * 8 + tx % 4 * 2 + e % 2 < HD:
                        out[b, i0 + tx % 32 // 4 + e // 2 * 8, h, (tx // 32 * NDT + n) * 8 + tx % 4 * 2 + e % 2] = \
                            T.Cast(F16, T.if_then_else(run[slot(tx), 2 + e // 2] > T.float32(0),
                                                       o[slot(tx), n * 4 + e] / run[slot(tx), 2 + e // 2],
                                                       T.float32(0)))

    return write
