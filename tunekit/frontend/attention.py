"""Scaled-dot-product attention becomes one kernel (frontend.attention_kernel) on fp16 GPU graphs.

What is matched, from the context matmul backwards (the ONNX exports of transformers' BERT and
tunekit's example transformer both have this shape once frontend.half has run):

    context = matmul(P, V)                  P: [B, H, S, SK], V: [B, H, SK, D]
    P       = [where(isnan(p), 0, p)] of p = astype(softmax(x, axis=-1), f16)
    x       = [astype] [add(scores, mask)] of scores = scalar * ... * astype(matmul(Q, K^T)), or that with
              a constant added per window of each image through reshapes to [images, windows, H, S, S] and back
              (Swin's shifted windows): the two masks become one constant
    Q, K^T, V: views (permute_dims, a reshape, expand_dims or squeeze that moves no element, a
            strided_slice of one axis, a take of one index, a scalar multiply) of a tensor; the kernel
            reads that tensor by strides, so the transposes, slices and splits of the combined QKV
            projection's output (BERT's slices, torch's packed in-projection in ViT) are never made.

The context is written as [B, S, H, D]; the graph's own permute_dims back to that order and its
cast then cancel (`_Cancel`), and the reshape to [B, S, H * D] that the output projection reads is
free. A mask may be any fp16/fp32 tensor that broadcasts to the scores. Anything else (another
softmax axis, a non-scalar scale, a shape whose K and V do not fit a thread block unless `key_tiles`) is left
as it was. fp16 graphs only: they are what tunekit runs on GPUs.
"""
from __future__ import annotations

import logging
import math

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from .attention_kernel import Attention, Operand, attention_kernel, plan

F16, F32 = "float16", "float32"
log = logging.getLogger("tunekit")


def _op(expr) -> str | None:
    return getattr(getattr(expr, "op", None), "name", None)


def _shape(expr):
    shape = getattr(getattr(expr, "ty", None), "shape", None)
    try:
        return tuple(int(d) for d in shape) if shape is not None else None
    except (TypeError, ValueError):
        return None


def _dtype(expr):
    return getattr(getattr(expr, "ty", None), "dtype", None)


def _scalar(expr) -> float | None:
    """The value of a constant with one element, else None."""
    if isinstance(expr, tvm.ir.expr.GenericConst) and int(np.prod(expr.value.shape)) == 1:
        return float(expr.value.numpy().reshape(()))
    return None


def _reshaped_strides(before, strides: list[int], after) -> list[int] | None:
    """The strides of `after`, a reshape of a view of shape `before` with `strides` that moves no element, or None
    when the reshape needs a copy. Size-1 axes go; the rest are matched in groups of equal product, and a group's
    axes must be one run of memory (each axis's stride its inner neighbour's times that one's size)."""
    if before is None or after is None or math.prod(before) != math.prod(after):
        return None
    old = [(n, st) for n, st in zip(before, strides) if n != 1]
    out, i = [], 0
    new_axes = [n for n in after if n != 1]
    j = 0
    while j < len(new_axes):
        group_new, group_old = [new_axes[j]], [old[i]] if i < len(old) else []
        j, i = j + 1, i + 1
        while math.prod(group_new) != math.prod(n for n, _ in group_old):
            if math.prod(group_new) < math.prod(n for n, _ in group_old):
                if j >= len(new_axes):
                    return None
                group_new.append(new_axes[j])
                j += 1
            else:
                if i >= len(old):
                    return None
                group_old.append(old[i])
                i += 1
        if any(group_old[k][1] != group_old[k + 1][1] * group_old[k + 1][0] for k in range(len(group_old) - 1)):
            return None  # the group's old axes are not one run of memory
        step = group_old[-1][1]
        strides_new = []
        for n in reversed(group_new):
            strides_new.insert(0, step)
            step *= n
        out += strides_new
    it = iter(out)
    return [0 if n == 1 else next(it) for n in after]


def _contiguous(shape) -> list[int]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.insert(0, step)
        step *= dim
    return strides


@mutator
class FuseAttention(PyExprMutator):
    def __init__(self, mod, gpu: bool, key_tiles: bool = False):
        super().__init__(mod)
        self.gpu, self.key_tiles = gpu, key_tiles
        self.fused = 0

    def _made_by(self, expr):
        return self.lookup_binding(expr) if isinstance(expr, relax.Var) else None

    def _through(self, expr, *ops):
        """Follow `expr` back through single-input ops named in `ops` (astype, ...)."""
        call = self._made_by(expr)
        while _op(call) in ops:
            expr = call.args[0]
            call = self._made_by(expr)
        return expr

    # ---------------------------------------------------------------- operands
    def _view(self, expr) -> tuple | None:
        """(source tensor, element offset, strides per axis of `expr`, scale) of a view of a tensor."""
        shape = _shape(expr)
        if shape is None:
            return None
        call = self._made_by(expr)
        name = _op(call)
        if name == "relax.permute_dims":
            inner = self._view(call.args[0])
            if inner is None:
                return None
            src, offset, strides, scale = inner
            axes = [int(a) for a in call.attrs.axes] if call.attrs.axes is not None else \
                list(reversed(range(len(strides))))
            return src, offset, [strides[a] for a in axes], scale
        if name in ("relax.reshape", "relax.expand_dims", "relax.squeeze"):
            # a reshape that moves no element (as numpy's view): ViT's [S, 1, 3C] -> [S, 1, 3, C] -> ... -> [1, H, S, D]
            inner = self._view(call.args[0])
            strides = None if inner is None else _reshaped_strides(_shape(call.args[0]), inner[2], shape)
            if strides is not None:
                return inner[0], inner[1], strides, inner[3]
        if name == "relax.take" and _scalar(call.args[1]) is not None and \
                len(_shape(call.args[1]) or ()) == 0:  # one slice along an axis: Q, K or V of a stacked [3, ...]
            before = _shape(call.args[0])
            axis = int(call.attrs.axis) % len(before) if before else 0
            index = int(_scalar(call.args[1]))
            inner = self._view(call.args[0]) if before and 0 <= index < before[axis] else None
            if inner is not None:
                src, offset, strides, scale = inner
                return src, offset + index * strides[axis], strides[:axis] + strides[axis + 1:], scale
        if name == "relax.strided_slice":  # args: data, axes, begin, end[, strides] (tuples of ints)
            axes, begin, _, *steps = ([int(f.value) for f in arg.fields] for arg in call.args[1:])
            before = _shape(call.args[0])
            if len(axes) == 1 and steps in ([], [[1]]) and before and 0 <= begin[0]:
                axis = axes[0] % len(before)
                if shape[axis] + begin[0] <= before[axis]:
                    inner = self._view(call.args[0])
                    if inner is None:
                        return None
                    src, offset, strides, scale = inner
                    return src, offset + begin[0] * strides[axis], strides, scale
        if name in ("relax.multiply", "relax.divide"):
            a, b = call.args
            factor = _scalar(b)
            if factor is None and name == "relax.multiply":
                a, factor = b, _scalar(a)
            if factor is not None and factor != 0:
                inner = self._view(a)
                if inner is not None:
                    src, offset, strides, scale = inner
                    return src, offset, strides, scale * (factor if name == "relax.multiply" else 1 / factor)
        return expr, 0, _contiguous(shape), 1.0

    def _operand(self, expr, order) -> tuple[relax.Expr, Operand, float] | None:
        """Q / V ("bhsd") or K^T ("bhds") as the kernel reads it: (source, Operand, scale)."""
        view = self._view(expr)
        if view is None or _dtype(view[0]) != F16 or _shape(view[0]) is None:
            return None
        src, offset, strides, scale = view
        if len(strides) != 4:
            return None
        sb, sh, s2, s3 = strides
        strides = (sb, sh, s2, s3) if order == "bhsd" else (sb, sh, s3, s2)
        return src, Operand(_shape(src), F16, offset, strides), scale

    # ---------------------------------------------------------------- scores
    def _scores(self, x) -> tuple | None:
        """(Q @ K^T call, scale, mask or None) behind the softmax input `x`."""
        x = self._through(x, "relax.astype")
        per_window = self._split_batch_add(x)
        if per_window is not None:
            x = self._through(per_window[0], "relax.astype")
        found = self._scores_and_mask(x)
        if found is None or per_window is None:
            return found
        mask = _sum_of_constants(found[2], per_window[1])
        return None if mask is None else (*found[:2], mask)

    def _scores_and_mask(self, x) -> tuple | None:
        mask, call = None, self._made_by(x)
        if _op(call) == "relax.add":
            for scores, other in (call.args, reversed(call.args)):
                found = self._scaled_matmul(scores)
                if found is not None:
                    return (*found, other)
            return None
        found = self._scaled_matmul(x)
        return None if found is None else (*found, mask)

    def _split_batch_add(self, x) -> tuple | None:
        """(y, C over y's axes) where x = reshape(add(reshape(y, [A, B, ...]), C), y's shape) with a constant C and
        the reshapes only splitting y's first axis in two: Swin's shifted windows add their mask so, one per window
        of each image ([images, windows, heads, S, S])."""
        outer = self._made_by(x)
        added = self._made_by(outer.args[0]) if _op(outer) == "relax.reshape" else None
        if _op(added) != "relax.add":
            return None
        for split, const in (added.args, reversed(added.args)):
            inner = self._made_by(split)
            if _op(inner) != "relax.reshape" or not isinstance(const, tvm.ir.expr.GenericConst):
                continue
            y = inner.args[0]
            before, after, value = _shape(y), _shape(split), const.value.numpy()
            if before is None or after is None or _shape(x) != before or len(after) != len(before) + 1 or \
                    after[2:] != before[1:] or after[0] * after[1] != before[0] or value.ndim > len(after):
                continue
            value = value.reshape((1,) * (len(after) - value.ndim) + value.shape)
            if any(c not in (1, a) for c, a in zip(value.shape, after)):
                continue
            per_row = np.broadcast_to(value, after[:2] + value.shape[2:]).reshape((before[0],) + value.shape[2:])
            return y, relax.const(np.ascontiguousarray(per_row), str(_dtype(const)))
        return None

    def _scaled_matmul(self, expr) -> tuple | None:
        scale = 1.0
        while True:
            expr = self._through(expr, "relax.astype")
            call = self._made_by(expr)
            if _op(call) == "relax.matmul":
                return call, scale
            if _op(call) not in ("relax.multiply", "relax.divide"):
                return None
            a, b = call.args
            factor = _scalar(b)
            if factor is None and _op(call) == "relax.multiply":
                a, factor = b, _scalar(a)
            if not factor:
                return None
            scale *= factor if _op(call) == "relax.multiply" else 1 / factor
            expr = a

    def _softmax_input(self, probs):
        """x of softmax(x, axis=-1) behind P (module doc), or None."""
        call = self._made_by(probs)
        if _op(call) == "relax.where":  # where(isnan(p), 0, p): fully masked rows give zeros
            cond, zero, p = call.args
            if _op(self._made_by(cond)) == "relax.isnan" and _scalar(zero) == 0.0:
                probs = p
        softmax = self._made_by(self._through(probs, "relax.astype"))
        if _op(softmax) != "relax.nn.softmax":
            return None
        x = softmax.args[0]
        if int(softmax.attrs.axis) not in (-1, len(_shape(x) or ()) - 1):
            return None
        return x

    def _mask(self, mask, scores_shape) -> Operand | None:
        shape = _shape(mask)
        if shape is None or len(shape) > 4 or _dtype(mask) not in (F16, F32):
            return None
        padded = (1,) * (4 - len(shape)) + shape
        if any(m not in (1, s) for m, s in zip(padded, scores_shape)):
            return None
        strides = tuple(0 if m == 1 else st for m, st in zip(padded, _contiguous(padded)))
        return Operand(shape or (1,), _dtype(mask), 0, strides)

    # ---------------------------------------------------------------- rewrite
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if _op(call) != "relax.matmul":
            return call
        try:
            fused = self._fuse(call)
        except Exception as exc:  # a graph this rewrite did not foresee: leave it as it was
            log.info("attention at %s not fused: %s", call.args[0], exc)
            fused = None
        return call if fused is None else fused

    def _fuse(self, context):
        probs, v = context.args
        out_shape = _shape(context)
        if out_shape is None or len(out_shape) != 4 or _dtype(probs) != F16:
            return None
        x = self._softmax_input(probs)
        found = None if x is None else self._scores(x)
        if found is None:
            return None
        qk, post_scale, mask = found
        q_expr, kt_expr = qk.args
        batch, heads, seq, dim = _shape(q_expr) or (0, 0, 0, 0)
        scores_shape = _shape(qk)
        if scores_shape is None or len(scores_shape) != 4 or scores_shape[:3] != (batch, heads, seq) or \
                _shape(kt_expr) != (batch, heads, dim, scores_shape[3]) or \
                _shape(v) != (batch, heads, scores_shape[3], dim):
            return None  # broadcast batch or heads (one K for all heads, say): not what the kernel reads
        q, k, vv = self._operand(q_expr, "bhsd"), self._operand(kt_expr, "bhds"), self._operand(v, "bhsd")
        if q is None or k is None or vv is None or vv[2] != 1.0:
            return None
        if mask is None:
            mask = relax.const(np.zeros((1,), np.float16))
        mask_operand = self._mask(mask, scores_shape)
        if mask_operand is None:
            return None
        spec = Attention(batch, heads, seq, scores_shape[3], dim, q[1], k[1], vv[1], mask_operand,
                         q[2] * k[2] * post_scale)
        if plan(spec, key_tiles=self.key_tiles) is None or not math.isfinite(spec.scale):
            return None
        func = self.builder_.add_func(attention_kernel(spec, gpu=self.gpu, key_tiles=self.key_tiles),
                                      "fused_attention")
        out = self.builder_.emit(relax.call_tir(func, (q[0], k[0], vv[0], mask),
                                                relax.TensorType((batch, seq, heads, dim), F16)))
        self.fused += 1
        context_f16 = relax.op.permute_dims(out, [0, 2, 1, 3])
        return context_f16 if _dtype(context) == F16 else relax.op.astype(context_f16, _dtype(context))


def _sum_of_constants(mask, extra):
    """mask + extra as one constant (numpy broadcasting), in mask's dtype; None when mask is not a constant."""
    if mask is None:
        return extra
    if not isinstance(mask, tvm.ir.expr.GenericConst):
        return None
    dtype = str(_dtype(mask))
    total = mask.value.numpy().astype(np.float32) + extra.value.numpy().astype(np.float32)
    return relax.const(total.astype(dtype), dtype)


@mutator
class _Cancel(PyExprMutator):
    """astype(astype(x: f16, f32), f16) -> x, permute_dims(permute_dims(x, p), q) -> x where q undoes p, or a
    reshape of x where together they move only size-1 axes, and two reshapes -> one: what is left around the
    fused kernel's output."""

    def _made_by(self, expr):
        for _ in range(8):  # through var-to-var bindings, which this pass itself leaves
            if not isinstance(expr, relax.Var):
                return expr
            expr = self.lookup_binding(expr)
        return None

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        name = _op(call)
        inner = self._made_by(call.args[0]) if call.args else None
        if name == "relax.astype" and _op(inner) == "relax.astype":
            original = inner.args[0]
            if _dtype(original) == str(call.attrs.dtype) == F16 and str(inner.attrs.dtype) == F32:
                return original
        if name == "relax.reshape" and _op(inner) == "relax.reshape":  # one reshape: a view, where two became a copy
            return relax.op.reshape(inner.args[0], call.args[1])
        if name == "relax.permute_dims" and _op(inner) == "relax.permute_dims" and \
                call.attrs.axes is not None and inner.attrs.axes is not None:
            outer_axes = [int(a) for a in call.attrs.axes]
            inner_axes = [int(a) for a in inner.attrs.axes]
            composed = [inner_axes[a] for a in outer_axes]
            if composed == list(range(len(outer_axes))):
                return inner.args[0]
            source = _shape(inner.args[0])
            moved = [a for a in composed if source and source[a] != 1]
            if source and moved == sorted(moved):  # only size-1 axes move (ViT's [1, S, H, D] -> [S, 1, H, D]): a view
                return relax.op.reshape(inner.args[0], [source[a] for a in composed])
        return call


def fuse_attention(mod, *, gpu: bool = True, key_tiles: bool = False):
    """(`mod` with each matched attention one kernel (module doc), how many were fused). `gpu=False`:
    kernels with serial loops for a CPU (attention_kernel), to check numerics where no GPU is. `key_tiles`: also
    the attentions whose K and V do not fit a block, with the key-tiled kernel (frontend.attention_flash), as
    tunekit's preparation asks (benchmarks/RESULTS.md, "key-tiled attention")."""
    mod = mod.clone()
    rewriter = FuseAttention(mod, gpu, key_tiles)
    main = rewriter.visit_expr(mod["main"])
    if not rewriter.fused:
        return mod, 0
    mod = rewriter.builder_.get()
    mod["main"] = main
    mod = relax.transform.DeadCodeElimination()(mod)
    mod["main"] = _Cancel(mod).visit_expr(mod["main"])
    return relax.transform.DeadCodeElimination()(mod), rewriter.fused
