"""A whole model in fp16, as PyTorch's `model.half()` runs it: weights and activations are fp16
between ops; matmuls and convs accumulate in fp32 and store fp16; norms, softmax and reductions
compute their statistics in fp32. The model's inputs and outputs keep their dtypes.

Why not TVM's ToMixedPrecision alone: it decides per op whether to follow its inputs, and a
transformer's residual stream starts in fp32 (the embedding lookup is never converted), so every
LayerNorm, residual add and elementwise op after it stayed fp32 and each matmul input needed a
cast kernel of its own. BERT-base had 36 such casts and 25 fp32 LayerNorms: 262 launches, 202 in
fp16 with Q/K/V combined (frontend.combine), 166 with the reshapes deferred (frontend.reshapes).

`to_half` raises NotHalvable when the graph has something it cannot retype (an opaque call_tir,
an op that makes fp32 from nothing); `to_half_partial` keeps each such binding in fp32 instead, with
casts at its boundary (its fp16 inputs widened, its fp32 output narrowed), converts the rest, and
names what it kept. Those casts fuse into the kernel around the binding.
"""
from __future__ import annotations

import numpy as np
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

F16, F32 = "float16", "float32"
# finite fp32 constants beyond it (attention masks' -3.4e38) become the fp16 extreme, not inf; an infinity stays one
# (transformers 5's -inf masks: a row masked everywhere is NaN, which the model itself turns into zeros)
FP16_MAX = 65504.0
ACCUMULATE_IN_FP32 = {"relax.matmul", "relax.nn.conv2d"}
STATISTICS_IN_FP32 = {"relax.nn.softmax", "relax.nn.log_softmax", "relax.nn.layer_norm", "relax.nn.group_norm",
                      "relax.nn.rms_norm", "relax.nn.instance_norm", "relax.mean", "relax.sum", "relax.prod",
                      "relax.variance", "relax.std", "relax.cumsum"}
OPAQUE = {"relax.call_tir", "relax.call_dps_packed", "relax.call_tir_inplace", "relax.call_tir_with_grad"}


class NotHalvable(Exception):
    """The graph has an op this pass cannot run in fp16 (the message names it)."""


def _dtype(expr):
    return getattr(expr.ty, "dtype", None)


def _accumulating_attrs(call):
    """`call`'s attrs with out_dtype float32 (the ops' own constructors make the attrs node)."""
    dummy = [relax.Var(n, relax.TensorType([1] * call.args[0].ty.ndim, F16)) for n in ("a", "b")]
    if call.op.name == "relax.matmul":
        return relax.op.matmul(*dummy, out_dtype=F32).attrs
    a = call.attrs
    return relax.op.nn.conv2d(*dummy, strides=a.strides, padding=a.padding, dilation=a.dilation, groups=a.groups,
                              data_layout=a.data_layout, kernel_layout=a.kernel_layout, out_layout=a.out_layout,
                              out_dtype=F32).attrs


@mutator
class ToHalf(PyExprMutator):
    def __init__(self, mod, params, partial=False):
        super().__init__(mod)
        self.params = {p.name: p for p in params}
        self.param_casts = {}
        self.partial = partial
        self.kept = []  # "var: what (why)" for each binding left in fp32

    def visit_generic_const_(self, const):
        if _dtype(const) != F32:
            return const
        value = const.value.numpy()
        return relax.const(np.where(np.isinf(value), value, np.clip(value, -FP16_MAX, FP16_MAX)).astype(np.float16))

    def visit_var_(self, var):
        var = super().visit_var_(var)
        param = self.params.get(var.name)
        if param is None or not param.same_as(var) or _dtype(var) != F32:
            return var
        if var.name not in self.param_casts:  # one cast per fp32 input, at its first use
            self.param_casts[var.name] = self.builder_.emit(relax.op.astype(var, F16))
        return self.param_casts[var.name]

    def visit_var_binding_(self, binding):
        try:
            if isinstance(binding.var, relax.DataflowVar):
                return super().visit_var_binding_(binding)
            # A dataflow block's output: what leaves the block keeps its fp32 type.
            value = self._widen(self.visit_expr(binding.value))
        except Exception as exc:  # nothing of this binding was emitted yet (casts of its inputs are harmless)
            if not self.partial:
                raise
            value = self._in_fp32(binding, exc)
            var = self.with_type(binding.var, value.ty)
            if not var.same_as(binding.var):
                self.set_var_remap(binding.var, var)
            return self.builder_.emit_normalized(relax.VarBinding(var, value))
        self.builder_.emit_normalized(relax.VarBinding(binding.var, value))

    def _in_fp32(self, binding, exc):
        """The binding as it was imported, on its inputs' fp32 values; its float outputs narrowed to
        fp16 unless it is the block's output (which stays fp32 anyway)."""
        table = {}
        for var in relax.analysis.free_vars(binding.value):
            param = self.params.get(var.name)
            if param is None or not param.same_as(var):  # the model's own inputs are fp32 already
                table[var] = self._retyped(self.visit_expr(var), var.ty)
        value = self.builder_.normalize(_substitute(binding.value, table))
        what = _what(binding.value)
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[-1][:120]
        why = "a TIR kernel" if what.startswith("call_") else why
        self.kept.append(f"{binding.var.name}: {what} ({why})")
        return value if not isinstance(binding.var, relax.DataflowVar) else self._retyped(value, None)

    def _retyped(self, value, ty):
        """`value` with each float tensor in `ty`'s dtype (None: fp16), field by field for tuples."""
        if isinstance(value.ty, relax.TupleType):
            fields = [self._retyped(self.builder_.emit(relax.TupleGetItem(value, i)),
                                    None if ty is None else ty.fields[i]) for i in range(len(value.ty.fields))]
            return relax.Tuple(fields)
        want = F16 if ty is None else getattr(ty, "dtype", None)
        have = _dtype(value)
        if have in (F16, F32) and want in (F16, F32) and have != want:
            return self.builder_.emit(relax.op.astype(value, want))
        return value

    def _widen(self, value):
        if isinstance(value.ty, relax.TupleType):
            fields = [self._widen(self.builder_.emit(relax.TupleGetItem(value, i)))
                      for i in range(len(value.ty.fields))]
            return relax.Tuple(fields)
        if _dtype(value) == F16:
            return self.builder_.emit(relax.op.astype(value, F32))
        return value

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        name = getattr(call.op, "name", None)
        if name in OPAQUE:
            raise NotHalvable(f"{name} of {getattr(call.args[0], 'name_hint', call.args[0])}")
        if name == "relax.astype" and str(call.attrs.dtype) == F32:
            return call.args[0] if _dtype(call.args[0]) == F16 else relax.op.astype(call.args[0], F16)
        if name in ACCUMULATE_IN_FP32 and all(_dtype(a) == F16 for a in call.args[:2]):
            wide = self.builder_.normalize(relax.Call(call.op, call.args, _accumulating_attrs(call)))
            return relax.op.astype(wide, F16)
        if name in STATISTICS_IN_FP32:
            args = [relax.op.astype(a, F32) if _dtype(a) == F16 else a for a in call.args]
            wide = self.builder_.normalize(relax.Call(call.op, args, call.attrs, call.ty_args))
            return relax.op.astype(wide, F16) if _dtype(wide) == F32 else wide
        try:
            out = self.builder_.normalize(call)
        except Exception as exc:
            raise NotHalvable(f"{name}: {str(exc).strip().splitlines()[-1][:120]}") from None
        if _dtype(out) == F32:
            raise NotHalvable(f"{name} makes float32 from non-float inputs")
        return out


def _substitute(expr, table):
    """`expr` (a binding's value: calls, tuples and leaves) with the vars in `table` replaced."""
    if isinstance(expr, relax.Var):
        return table.get(expr, expr)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([_substitute(f, table) for f in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(_substitute(expr.tuple_value, table), expr.index)
    if isinstance(expr, relax.Call):
        return relax.Call(expr.op, [_substitute(a, table) for a in expr.args], expr.attrs, expr.ty_args)
    if isinstance(expr, (relax.If, relax.Function, relax.SeqExpr)):  # not in an imported main
        raise NotHalvable(f"a {type(expr).__name__} binding")
    return expr  # a leaf: constant, shape, prim value


def _what(value):
    """A binding's op, as the report names it: "relax.nn.pad", "call_tir resize2d"."""
    op = getattr(value, "op", None)
    name = getattr(op, "name", None) or type(value).__name__
    if name in OPAQUE and value.args:
        return f"{name.removeprefix('relax.')} {getattr(value.args[0], 'name_hint', value.args[0])}"
    return name


def _convert(mod, partial):
    main = mod["main"]
    mutator_ = ToHalf(mod, main.params, partial=partial)
    try:
        converted = mutator_.visit_expr(main)
    except NotHalvable:
        raise
    except Exception as exc:  # a TVM type error deep in the rewrite: the graph is not for this pass
        raise NotHalvable(str(exc).strip().splitlines()[-1][:200]) from None
    mod = mod.clone()
    mod["main"] = converted
    return relax.transform.FoldConstant()(mod), mutator_.kept


def to_half(mod):
    """`mod` with its main function in fp16 (module doc). Raises NotHalvable."""
    return _convert(mod, partial=False)[0]


def to_half_partial(mod):
    """(mod, kept): `mod` in fp16 except the bindings to_half cannot retype, each kept in fp32 with
    casts at its boundary; `kept` names them ("lv6: call_tir resize2d (why)"), [] when none. Raises
    NotHalvable only when a kept binding cannot be re-emitted either."""
    mod, kept = _convert(mod, partial=True)
    return (relax.transform.DeadCodeElimination()(mod) if kept else mod), kept
