"""A constant GEMM weight whose rows do not start on 16 bytes is stored transposed, so its kernel reads it in vectors.

A matmul's B laid out [K, N] with N elements not a multiple of 16 bytes puts every row but the first off a 16-byte
boundary, and no kernel can then load it 16 bytes at a time. ONNX exporters write a tied LM head's weight that way
(GPT-2: [768, 50257]); at 40% of an H200 Triton's best tile took 506 µs on it against 186 µs on the same weight laid
out [N, K] (benchmarks/results/h200-transformers-max-autotune, "GPT-2's LM head"). This pass runs between FoldConstant and FuseOps: each
such matmul gets its weight as a constant [N, K] and a PrimFunc that reads it as B[n, k] (kernels.gemm_plan's
b_transposed), so its epilogue still fuses into it.
"""
from __future__ import annotations

import tvm
from tvm import relax

from .main_blocks import with_main_blocks

ALIGN_BYTES = 16


def transpose_unaligned_weights(mod) -> tuple[object, int]:
    """(module, how many matmul calls now read a transposed constant). Runs on a legalized module (call_tir)."""
    main = mod["main"]
    builder = relax.BlockBuilder(mod)
    made: dict = {}  # the original matmul's GlobalVar -> its transposed-weight twin's
    blocks, changed = [], 0
    for block in main.body.blocks:
        bindings = []
        for binding in block.bindings:
            new = _rewritten(mod, builder, binding.value, made) if isinstance(binding, relax.VarBinding) else None
            if new is not None:
                binding, changed = relax.VarBinding(binding.var, new), changed + 1
            bindings.append(binding)
        blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                      else relax.BindingBlock(bindings))
    if not changed:
        return mod, 0
    return with_main_blocks(builder, main, blocks), changed


def _rewritten(mod, builder, call, made):
    """The call with its unaligned weight transposed, or None when it is not such a matmul."""
    from ..kernels.gemm_plan import plan_of

    if not (isinstance(call, relax.Call) and getattr(call.op, "name", None) == "relax.call_tir"):
        return None
    gv, args = call.args[0], list(call.args[1].fields)
    func = mod[gv]
    plan = plan_of(func) if isinstance(func, tvm.tirx.PrimFunc) else None
    if plan is None or plan.splits != 1 or plan.b_transposed or plan.epilogue or len(args) != 2 \
            or len(func.params[plan.a].shape) != len(func.params[plan.out].shape):
        return None
    weight = args[plan.b]
    b_buf = func.params[plan.b]  # its dtype and rank, without copying the weight out of the constant
    if not isinstance(weight, tvm.ir.expr.Constant) or len(b_buf.shape) != 2 \
            or plan.n * tvm.DataType(str(b_buf.dtype)).bits // 8 % ALIGN_BYTES == 0:
        return None
    if gv not in made:
        made[gv] = builder.add_func(_reading_transposed(func, plan), f"{gv.name_hint}_nt")
    args[plan.b] = relax.const(weight.value.numpy().T.copy())
    return relax.Call(call.op, [made[gv], relax.Tuple(args)], call.attrs, call.ty_args)


def _reading_transposed(func, plan):
    """`func`'s matmul (fp32 accumulation of its inputs' products) with B as [N, K], its parameters in its order."""
    from tvm import te

    x_buf, out_buf = func.params[plan.a], func.params[plan.out]
    x = te.placeholder(_int64(x_buf.shape), plan.in_dtype, "A")
    w = te.placeholder(_int64((plan.n, plan.k)), plan.in_dtype, "B")
    k = te.reduce_axis(tuple(_int64((0, plan.k))), "k")
    out = te.compute(_int64(out_buf.shape), lambda *i: te.sum(
        x[(*i[:-1], k)].astype(plan.out_dtype) * w[i[-1], k].astype(plan.out_dtype), axis=k), name="matmul")
    params = {plan.a: x, plan.b: w, plan.out: out}
    made = te.create_prim_func([params[i] for i in sorted(params)]).without_attr("global_symbol")
    for key, value in (func.attrs.items() if func.attrs is not None else ()):
        made = made.with_attr(key, value)
    return made


def _int64(values) -> list:
    """Shapes as Relax's legalized functions have them (int64): FuseTIR refuses buffers that differ in that."""
    return [tvm.tirx.IntImm("int64", int(v)) for v in values]
