"""Negative axes written as positive ones, before ConvertLayout.

TVM 0.27's layout inference takes a negative axis as an index: R.squeeze(x, axis=[-2]) ends
ConvertLayout with `std::bad_alloc`, R.permute_dims with a negative axis with "Invalid layout", and
R.stack with a string-index error. It runs on every op, whether or not a conv's layout reaches it,
so one such op refused fp16 for the whole model: ViT-B/16 exported by torch.onnx with dynamo=True
squeezes the [3, ...] QKV tensor with axis=[-2] in every block.
"""
from __future__ import annotations

from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator


def _positive(axes, ndim: int):
    """`axes` with negatives counted from the end; None when nothing changes or ndim is unknown."""
    if axes is None or ndim < 0 or all(int(a) >= 0 for a in axes):
        return None
    return [int(a) % ndim for a in axes]


@mutator
class _PositiveAxes(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.rewritten = 0

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        name = getattr(call.op, "name", None)
        new = None
        if name == "relax.squeeze":
            axes = _positive(call.attrs.axis, call.args[0].ty.ndim)
            new = None if axes is None else relax.op.squeeze(call.args[0], axes)
        elif name == "relax.permute_dims":
            axes = _positive(call.attrs.axes, call.args[0].ty.ndim)
            new = None if axes is None else relax.op.permute_dims(call.args[0], axes)
        elif name == "relax.stack" and getattr(call.args[0].ty, "fields", None) and call.attrs.axis is not None:
            axes = _positive([call.attrs.axis], call.args[0].ty.fields[0].ndim + 1)
            new = None if axes is None else relax.op.stack(call.args[0], axes[0])
        if new is None:
            return call
        self.rewritten += 1
        return new


def positive_axes(mod):
    """(mod, how many ops changed): main's squeeze/permute_dims/stack with axes >= 0 (`mod` itself
    when none had a negative one)."""
    rewriter = _PositiveAxes(mod)
    main = rewriter.visit_expr(mod["main"])
    if not rewriter.rewritten:
        return mod, 0
    mod = mod.clone()
    mod["main"] = main
    return mod, rewriter.rewritten
