"""Matmuls with a long reduction and a small output are split along K (split-K), as cuBLAS does.

BERT-base's feed-forward down-projection (M=128, N=768, K=3072) was the largest kernel of the
tuned fp16 model at a 40% share: 30 µs after 656 trials, 16x its memory floor, while the
up-projection with the same FLOPs (N=3072, K=768) tuned to 13.5 µs. Its output is 128 x 768, so
at tensor-core tile sizes a few dozen thread blocks run a 3072-long reduction each and most of
the share's SMs idle. MetaSchedule's tensor-core rules never split a reduction across blocks.

So the matmul becomes S partial products over K/S slices, C[s,i,j] = sum_k A[i, s*Kc+k] *
B[s*Kc+k, j] (one kernel with S times the blocks, fp32 partials; a TIR function of our own,
because Relax would need a transpose of A to express the strided slices as a batched matmul),
and a sum of the S slices, an injective kernel into which the matmul's old epilogue (cast, bias,
residual add) fuses. MetaSchedule tensorizes the partial products like any fp16 matmul.

Only fp16 matmuls that accumulate in fp32 against a 2-D constant weight (frontend.half's output)
are split, and only where the reduction dominates: K >= 4 * N and K >= 1024, with at least 16
rows. No CNN layer of torchvision's models qualifies (their classifiers have K < 4 * N).
"""
from __future__ import annotations

import tvm
from tvm import relax, te
from tvm.relax.expr_functor import PyExprMutator, mutator

F16, F32 = "float16", "float32"
MIN_K, MIN_ROWS, K_PER_N = 1024, 16, 4
SLICE_MULTIPLE = 64  # each slice a whole number of the tensor-core rules' 64-deep K tiles


def split_count(m: int, n: int, k: int) -> int:
    """How many slices a (m x k) @ (k x n) matmul's reduction is split into; 1 means not split."""
    if m < MIN_ROWS or k < MIN_K or k < K_PER_N * n:
        return 1
    for slices in (4, 2):
        if k % (slices * SLICE_MULTIPLE) == 0:
            return slices
    return 1


def partial_products(rows: tuple[int, ...], n: int, k: int, slices: int) -> tvm.tirx.PrimFunc:
    """C[s, i, j] = sum over the s-th K/slices slice of A[..., i, :] * B[:, j], in fp32. A's
    leading dims `rows` are (1, ..., 1, m): a batch-1 activation is read as it is, no reshape."""
    depth, m = k // slices, rows[-1]
    ones = (0,) * (len(rows) - 1)
    a = te.placeholder((*rows, k), F16, name="A")
    b = te.placeholder((k, n), F16, name="B")
    r = te.reduce_axis((0, depth), name="k")
    c = te.compute((slices, m, n), lambda s, i, j: te.sum(
        a[(*ones, i, s * depth + r)].astype(F32) * b[s * depth + r, j].astype(F32), axis=r), name="C")
    # te names every PrimFunc "main"; the module's own symbols are given when it is built
    return te.create_prim_func([a, b, c]).without_attr("global_symbol")


def _static(shape):
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        return None


@mutator
class SplitK(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.split = 0

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if getattr(call.op, "name", None) != "relax.matmul" or str(call.attrs.out_dtype) != F32:
            return call
        x, w = call.args
        x_shape, w_shape = _static(x.ty.shape), _static(getattr(w.ty, "shape", ()))
        if (x_shape is None or not w_shape or len(w_shape) != 2 or len(x_shape) < 2
                or not isinstance(w, tvm.ir.expr.GenericConst) or x.ty.dtype != F16 or w.ty.dtype != F16):
            return call
        k, n = w_shape
        m = 1
        for d in x_shape[:-1]:
            m *= d
        slices = split_count(m, n, k)
        if slices == 1:
            return call
        if any(d != 1 for d in x_shape[:-2]):
            x, x_rows = self.builder_.emit(relax.op.reshape(x, (m, k))), (m,)
        else:
            x_rows = x_shape[:-1]
        # named matmul_*: the task scheduler compares its FLOP rate with the other matmuls'
        func = self.builder_.add_func(partial_products(x_rows, n, k, slices), "matmul_split_k")
        parts = self.builder_.emit(relax.call_tir(func, (x, w), relax.TensorType((slices, m, n), F32)))
        total = relax.op.squeeze(relax.op.strided_slice(parts, axes=[0], begin=[0], end=[1]), axis=[0])
        for s in range(1, slices):
            part = relax.op.squeeze(relax.op.strided_slice(parts, axes=[0], begin=[s], end=[s + 1]), axis=[0])
            total = self.builder_.emit(relax.op.add(total, part))
        self.split += 1
        return relax.op.reshape(total, (*x_shape[:-1], n))


def split_long_reductions(mod):
    """(`mod` with qualifying fp16 matmuls split along K (module doc), how many were split)."""
    mod = mod.clone()
    rewriter = SplitK(mod)
    main = rewriter.visit_expr(mod["main"])
    if not rewriter.split:
        return mod, 0
    mod = rewriter.builder_.get()
    mod["main"] = main
    return relax.transform.DeadCodeElimination()(mod), rewriter.split
