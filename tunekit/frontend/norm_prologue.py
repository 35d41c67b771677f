"""The elementwise kernel in front of a LayerNorm is folded into the LayerNorm's kernel.

In BERT-base every LayerNorm reads the output of one injective kernel: the split-K sum with its
cast, bias and residual add after the feed-forward block (frontend.split_k), and the embeddings'
sum. Each of those kernels and each LayerNorm runs at the launch floor, for far less memory traffic
(benchmarks/RESULTS.md, "BERT attention"). One kernel instead of two saves a launch per pair.

Relax's FuseOps never does it: LegalizeOps' layer_norm is `kOutEWiseFusable` (like a conv), so
only elementwise consumers fuse into it, never producers. Marking it `kCommReduce` would let the
producers in but shut out the cast after it. So this pass runs between FuseOps and FuseTIR and
merges two of FuseOps' groups into one when:
- the consumer group calls a normalization kernel (layer_norm, rms_norm);
- the producer group is injective (every kernel it calls is at most `kInjective`);
- the producer's output is used by that consumer only.
FuseTIR then makes the merged group one PrimFunc; the schedule (DLight's or MetaSchedule's)
inlines the producer into the normalization's reads. That recomputes the producer once per pass
over the row (sum, variance, output), which costs L2 reads, not launches.
"""
from __future__ import annotations

import tvm
from tvm import relax

from .main_blocks import with_main_blocks

NORM_KERNELS = ("layer_norm", "rms_norm")
INJECTIVE = 2  # relay/relax OpPatternKind: elementwise 0, broadcast 1, injective 2


def _callees(func):
    """The GlobalVars of the PrimFuncs a FuseOps group calls."""
    return [b.value.args[0] for block in func.body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and getattr(b.value.op, "name", None) == "relax.call_tir"]


def _group(mod, expr):
    """(function, arguments) of a kernel group `expr` calls: a FuseOps (Primitive) function, or a
    single call_tir, which FuseOps leaves unwrapped, as a function of its own. None otherwise."""
    if not isinstance(expr, relax.Call):
        return None
    if getattr(expr.op, "name", None) == "relax.call_tir":
        return _single_kernel(expr), list(expr.args[1].fields)
    if not isinstance(expr.op, relax.GlobalVar):
        return None
    func = mod[expr.op]
    if isinstance(func, relax.Function) and func.attrs and func.attrs.get("Primitive", False):
        return func, list(expr.args)
    return None


def _single_kernel(call) -> relax.Function:
    params = [relax.Var(f"arg{i}", arg.ty) for i, arg in enumerate(call.args[1].fields)]
    out = relax.Var("out", call.ty)
    inner = relax.Call(call.op, [call.args[0], relax.Tuple(params)], call.attrs, call.ty_args)
    body = relax.SeqExpr([relax.DataflowBlock([relax.VarBinding(out, inner)])], out)
    return relax.Function(params, body, call.ty, attrs=tvm.ir.make_node("ir.DictAttrs", Primitive=True))


def _calls_norm(func) -> bool:
    return any(gv.name_hint.startswith(NORM_KERNELS) for gv in _callees(func))


def _is_injective(mod, func) -> bool:
    kernels = [mod[gv] for gv in _callees(func)]
    return bool(kernels) and all(
        k.attrs is not None and int(k.attrs.get("op_pattern", 99)) <= INJECTIVE for k in kernels)


def _merge(producer: relax.Function, consumer: relax.Function, index: int) -> relax.Function:
    """One function: the producer's bindings, then the consumer's with its `index`-th parameter
    replaced by the producer's result."""
    producer = relax.utils.copy_with_new_vars(producer)
    consumer = relax.utils.copy_with_new_vars(consumer)
    result = producer.body.body
    consumer = consumer.bind_params({consumer.params[index]: result})
    bindings = [b for block in producer.body.blocks for b in block.bindings]
    bindings += [b for block in consumer.body.blocks for b in block.bindings]
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], consumer.body.body)
    return relax.Function(list(producer.params) + list(consumer.params), body, consumer.ret_ty,
                          attrs=consumer.attrs)


def _name(expr) -> str:
    gv = expr.args[0] if getattr(expr.op, "name", None) == "relax.call_tir" else expr.op
    return gv.name_hint.removeprefix("fused_")


def _fold_block(mod, builder, block) -> tuple[relax.DataflowBlock, int]:
    users = relax.analysis.udchain(block)
    bound = {b.var: b.value for b in block.bindings}
    dropped, replaced = set(), {}
    for binding in block.bindings:
        consumer = _group(mod, binding.value)
        if consumer is None or not _calls_norm(consumer[0]):
            continue
        for index, arg in enumerate(consumer[1]):
            producer = _group(mod, bound[arg]) if isinstance(arg, relax.DataflowVar) and arg in bound else None
            if producer is None or len(users.get(arg, ())) != 1 or not _is_injective(mod, producer[0]):
                continue
            merged = builder.normalize(_merge(producer[0], consumer[0], index))
            gv = builder.add_func(merged, f"fused_{_name(bound[arg])}_{_name(binding.value)}")
            args = producer[1] + [a for i, a in enumerate(consumer[1]) if i != index]
            replaced[binding.var] = relax.VarBinding(binding.var, builder.normalize(relax.Call(gv, args)))
            dropped.add(arg)
            break  # a norm has one input worth folding (its data); the rest are weights
    if not dropped:
        return block, 0
    return relax.DataflowBlock([replaced.get(b.var, b) for b in block.bindings if b.var not in dropped]), len(dropped)


def fold_norm_prologues(mod) -> tuple[object, int]:
    """(module, how many producers were folded). Runs on FuseOps' output, before FuseTIR."""
    main = mod["main"]
    builder = relax.BlockBuilder(mod)
    blocks, folded = [], 0
    for block in main.body.blocks:
        if isinstance(block, relax.DataflowBlock):
            block, count = _fold_block(mod, builder, block)
            folded += count
        blocks.append(block)
    if not folded:
        return mod, 0
    return with_main_blocks(builder, main, blocks), folded
