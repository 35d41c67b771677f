"""Parallel matmuls that read one input become one matmul (a transformer's Q, K and V projections:
three launches of N=768 become one of N=2304, which also fills more of the GPU).

TVM's CombineParallelMatmul does the combining, but it matches only weights and biases bound to
variables, and only `add(matmul, bias)` in that order, while the ONNX importer inlines constants
and writes `add(bias, matmul)`; so they are bound and ordered first. Its `split` would be one more
kernel with three outputs, which no fusion absorbs: each part becomes a strided_slice, an
injective op that fuses into the reshape/transpose that reads it.
"""
from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator


def _constant(expr) -> bool:
    return isinstance(expr, tvm.ir.expr.GenericConst)


def _op_name(expr):
    return getattr(getattr(expr, "op", None), "name", None)


@mutator
class BindWeights(PyExprMutator):
    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        name = _op_name(call)
        if name == "relax.matmul" and _constant(call.args[1]):
            return relax.Call(call.op, [call.args[0], self.builder_.emit(call.args[1])], call.attrs)
        if name == "relax.add":
            a, b = call.args
            if _constant(a):
                a, b = b, a
            made_by = self.lookup_binding(a) if isinstance(a, relax.Var) else None
            if _constant(b) and _op_name(made_by) == "relax.matmul":
                return relax.Call(call.op, [a, self.builder_.emit(b)], call.attrs)
        return call


@mutator
class SplitToSlices(PyExprMutator):
    def visit_tuple_getitem_(self, item):
        item = self.visit_expr_post_order(item)
        source = item.tuple_value
        split = self.lookup_binding(source) if isinstance(source, relax.Var) else None
        if _op_name(split) != "relax.split":
            return item
        data = split.args[0]
        axis = int(split.attrs.axis) % data.ty.ndim
        extent = int(data.ty.shape[axis])
        bounds = [0] + [int(i) for i in split.attrs.indices_or_sections] + [extent]
        return relax.op.strided_slice(data, axes=[axis], begin=[bounds[item.index]],
                                      end=[bounds[item.index + 1]])


def combine_parallel_matmuls(mod):
    """`mod` with each group of matmuls sharing an input combined (module doc)."""
    mod = mod.clone()
    mod["main"] = BindWeights(mod).visit_expr(mod["main"])
    mod = relax.transform.CombineParallelMatmul()(mod)
    mod["main"] = SplitToSlices(mod).visit_expr(mod["main"])
    mod = relax.transform.DeadCodeElimination()(mod)
    mod = relax.transform.CanonicalizeBindings()(mod)  # the bound weights go back inline
    return relax.transform.FoldConstant()(mod)           # the concatenated weights, computed once
