"""Reshapes between a matmul and its elementwise neighbours are moved out of the way, so that
those ops fuse into the matmul's kernel.

ONNX exports of transformers flatten activations around their matmuls: BERT's feed-forward block
is reshape (1,128,768)->(128,768), matmul, bias add, reshape back to 3-D, GELU, reshape to 2-D,
matmul, bias add, reshape to 3-D, residual add. A reshape is an injective op that ends a matmul's
epilogue fusion, so GELU and the residual add were kernels of their own (and one reshape too):
36 of BERT-base's 202 launches.

A reshape that only splits or merges leading dimensions (the last one unchanged) commutes with a
matmul of a 2-D right-hand side (on its left operand) and with elementwise ops whose other
operands are scalars or vectors along the last dimension. So it is deferred: such ops run on the
tensor before the reshape, and the reshape is only made where something else needs its result,
or not at all when a later reshape restores the original shape.

A transpose that only moves axes of size 1 keeps the elements in order: it is a reshape. torchvision's
multi-head attention ends so: out-projection [S, C], reshape [S, 1, C], transpose to [1, S, C], residual add;
that add was a kernel of its own (ViT-B/16: 12 of them). An elementwise operand of the reshaped shape (the
residual) is reshaped to the tensor's own shape instead (a view), so the add joins the matmul's epilogue.
"""
from __future__ import annotations

from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

# Elementwise ops that broadcast the same way whatever the leading dims of their tensor operand.
ELEMENTWISE = {"relax.add", "relax.subtract", "relax.multiply", "relax.divide", "relax.power", "relax.maximum",
               "relax.minimum", "relax.erf", "relax.tanh", "relax.sigmoid", "relax.exp", "relax.sqrt", "relax.rsqrt",
               "relax.negative", "relax.nn.relu", "relax.nn.gelu", "relax.nn.gelu_tanh", "relax.nn.silu",
               "relax.astype", "relax.clip"}


def _static_shape(ty):
    shape = getattr(ty, "shape", None)
    if shape is None:
        return None
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):  # a symbolic dim
        return None


def _moves_leading_dims_only(before, after) -> bool:
    return (before is not None and after is not None and len(before) >= 2 and len(after) >= 2
            and before[-1] == after[-1] and _prod(before) == _prod(after))


def _keeps_order(shape, axes) -> bool:
    """A transpose of `shape` by `axes` (None: reversed) moves only axes of size 1: the elements stay in order."""
    if shape is None:
        return False
    axes = list(range(len(shape)))[::-1] if axes is None else [int(a) for a in axes]
    moved = [a for a in axes if shape[a] != 1]
    return moved == sorted(moved)


def _prod(shape) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


@mutator
class DeferReshapes(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.deferred = {}      # var -> (the tensor before the reshape, the reshaped shape)
        self.materialized = {}  # var -> the reshape, once something needed it

    def _resolve(self, arg):
        """(tensor before the reshape, shape) if `arg` is a deferred reshape, else None."""
        return self.deferred.get(arg) if isinstance(arg, relax.Var) else None

    def _materialize(self, var):
        if var not in self.materialized:
            real, shape = self.deferred[var]
            self.materialized[var] = self.builder_.emit(relax.op.reshape(real, shape))
        self.set_var_remap(var, self.materialized[var])

    def _defer(self, var, real):
        shape = _static_shape(var.ty)
        if _static_shape(real.ty) == shape:
            self.set_var_remap(var, real)  # the reshapes cancelled out
        else:
            self.deferred[var] = (real, shape)

    def visit_var_binding_(self, binding):
        value, var = binding.value, binding.var
        if isinstance(var, relax.DataflowVar) and isinstance(value, relax.Call) and self._try_defer(var, value):
            return
        for arg in getattr(value, "args", ()):
            if self._resolve(arg) is not None:
                self._materialize(arg)
        if isinstance(value, relax.Tuple):
            for field in value.fields:
                if self._resolve(field) is not None:
                    self._materialize(field)
        if isinstance(value, relax.Var) and self._resolve(value) is not None:
            self._materialize(value)
        super().visit_var_binding_(binding)

    def _try_defer(self, var, call) -> bool:
        name = getattr(call.op, "name", None)
        args = list(call.args)
        if name == "relax.permute_dims" and isinstance(args[0], relax.Var) \
                and _keeps_order(_static_shape(args[0].ty), call.attrs.axes):
            name = "relax.reshape"  # it moves only axes of size 1 (module doc)
        if name == "relax.reshape" and isinstance(args[0], relax.Var):
            source = self._resolve(args[0])
            real = source[0] if source else self.visit_expr(args[0])
            if not _moves_leading_dims_only(_static_shape(real.ty), _static_shape(var.ty)):
                return False
            self._defer(var, real)
            return True
        if name == "relax.matmul" and self._resolve(args[0]) is not None and self._resolve(args[1]) is None \
                and getattr(args[1].ty, "ndim", 0) == 2:
            real = self._resolve(args[0])[0]
            out = self.builder_.emit(relax.Call(call.op, [real, self.visit_expr(args[1])], call.attrs))
            self._defer(var, out)
            return True
        if name in ELEMENTWISE and any(self._resolve(a) is not None for a in args):
            return self._defer_elementwise(var, call, args)
        return False

    def _defer_elementwise(self, var, call, args) -> bool:
        deferred = [self._resolve(a) for a in args if self._resolve(a) is not None]
        real_shape = _static_shape(deferred[0][0].ty)
        if any(_static_shape(real.ty) != real_shape or shape != deferred[0][1] for real, shape in deferred):
            return False
        new_args = []
        for arg in args:
            source = self._resolve(arg)
            if source is not None:
                new_args.append(source[0])
                continue
            ndim = getattr(arg.ty, "ndim", -1)
            if _static_shape(arg.ty) == deferred[0][1]:  # the reshaped shape itself: reshaped back, a view
                new_args.append(self.builder_.emit(relax.op.reshape(self.visit_expr(arg), real_shape)))
                continue
            if ndim not in (0, 1):  # broadcasting over leading dims would change with the reshape
                return False
            new_args.append(self.visit_expr(arg))
        out = self.builder_.emit(relax.Call(call.op, new_args, call.attrs, call.ty_args))
        self._defer(var, out)
        return True


def defer_reshapes(mod):
    """`mod` with reshapes deferred past matmuls and elementwise ops (module doc)."""
    mod = mod.clone()
    mod["main"] = DeferReshapes(mod).visit_expr(mod["main"])
    return relax.transform.DeadCodeElimination()(mod)
