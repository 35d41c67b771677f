"""x ** 2 and x ** 3 written as products, for CUDA builds.

TVM's NVRTC options (and so tunekit's, clients.cuda_compile) include --use_fast_math, under which CUDA's powf is
__powf, exp2(y * log2(x)): NaN for every x < 0, even with an integer exponent. GPT-2's GELU
(0.5 x (1 + tanh(c (x + 0.044715 x ** 3)))) and a variance written as Pow(x - mean, 2) (RMSNorm, decomposed
LayerNorm) then give NaN on the GPU, in fp32 as in fp16, while LLVM's powf on a CPU is right.
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

EXPONENTS = (2.0, 3.0)


def _exponent(expr, lookup) -> float | None:
    """The value of a one-element constant exponent, else None."""
    if isinstance(expr, relax.Var):
        expr = lookup(expr) or expr
    if not isinstance(expr, tvm.ir.expr.Constant):
        return None
    value = expr.value.numpy()
    return float(value.reshape(-1)[0]) if value.size == 1 else None


@mutator
class _Products(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.rewritten = 0

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if getattr(call.op, "name", None) != "relax.power":
            return call
        x, exponent = call.args
        value = _exponent(exponent, self.lookup_binding)
        # only where the product has the power's own shape and dtype (a one-element exponent broadcasts no further)
        if value not in EXPONENTS or not tvm_ffi.structural_equal(x.ty, call.ty):
            return call
        self.rewritten += 1
        square = relax.op.multiply(x, x)
        return square if value == 2.0 else relax.op.multiply(square, x)


def powers_as_products(mod) -> tuple[object, int]:
    """(mod with every x ** 2 and x ** 3 of a constant exponent as x * x and x * x * x, how many were)."""
    rewritten, mod = 0, mod.clone()  # the caller's module stays as it was
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            products = _Products(mod)
            mod[gvar] = products.visit_expr(func)
            rewritten += products.rewritten
    return mod, rewritten
