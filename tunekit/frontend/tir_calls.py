"""Kernels the ONNX importer writes straight as TIR that are plain Relax ops, lifted back to Relax.

TVM 0.27's importer emits Einsum and Pad as R.call_tir of a PrimFunc made by topi. No Relax pass
can retype a call_tir (ToMixedPrecision fails on it with "Expected TensorType, but got
R.Callable"; frontend.half keeps it in fp32), so:
- an Einsum of two operands that is a contraction becomes R.matmul, with permute_dims/reshape
  around it where needed (maxvit_t's attention, "bghid,bghjd->bghij" and "bghij,bghjd->bghid");
- a constant Pad becomes R.nn.pad, and a Pad of zero widths its input (swin_t pads its windows,
  by zero at 224x224).
A PrimFunc is recognised by its structure (one block, plain indices), never by its name alone.
"""
from __future__ import annotations

import math

import tvm_ffi
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator


def _only_block(func):
    """(block, extents) of a PrimFunc that is one perfect loop nest over one block, else None."""
    root = getattr(func.body, "block", None)
    if root is None or list(root.alloc_buffers) or list(root.match_buffers):
        return None
    stmt, loops = root.body, []
    while isinstance(stmt, tirx.For):
        loops.append(stmt)
        stmt = stmt.body
    block = getattr(stmt, "block", None)
    if block is None or list(block.alloc_buffers) or list(block.match_buffers):
        return None
    if not (isinstance(stmt.predicate, tirx.IntImm) and int(stmt.predicate) == 1):
        return None
    if [str(v) for v in stmt.iter_values] != [str(loop.loop_var) for loop in loops]:
        return None
    extents = []
    for iv, loop in zip(block.iter_vars, loops):
        if not all(isinstance(e, tirx.IntImm) for e in (iv.dom.min, iv.dom.extent, loop.min, loop.extent)):
            return None
        if int(iv.dom.min) or int(loop.min) or int(iv.dom.extent) != int(loop.extent):
            return None
        extents.append(int(loop.extent))
    return (block, extents) if len(extents) == len(block.iter_vars) == len(loops) else None


def _positions(indices, block):
    """Which block iter var each index is (all distinct), else None."""
    names = [str(iv.var) for iv in block.iter_vars]
    out = [names.index(str(i)) if isinstance(i, tirx.Var) and str(i) in names else None for i in indices]
    return None if None in out or len(set(out)) != len(out) else out


def _load(expr, buffer):
    if type(expr).__name__ != "TensorLoad" or (buffer is not None and not expr.source.same_as(buffer)):
        return None
    return expr


def einsum_axes(func):
    """(a axes, b axes, out axes, extents) of `out[o] += a[i] * b[j]` with plain indices, else None."""
    found = _only_block(func)
    if found is None or len(func.params) != 3:
        return None
    block, extents = found
    a_buf, b_buf, out_buf = func.params
    init, body = block.init, block.body
    if not isinstance(init, tirx.BufferStore) or not isinstance(body, tirx.BufferStore):
        return None
    if not (init.buffer.same_as(out_buf) and body.buffer.same_as(out_buf) and isinstance(init.value, tirx.FloatImm)
            and float(init.value.value) == 0.0 and isinstance(body.value, tirx.Add)
            and isinstance(body.value.b, tirx.Mul)):
        return None
    acc, a, b = _load(body.value.a, out_buf), _load(body.value.b.a, a_buf), _load(body.value.b.b, b_buf)
    if acc is None or a is None or b is None or [str(i) for i in acc.indices] != [str(i) for i in body.indices]:
        return None
    axes = [_positions(x.indices, block) for x in (a, b, body)]
    spatial = [i for i, iv in enumerate(block.iter_vars) if int(iv.iter_type) == tirx.IterVar.DataPar]
    if None in axes or sorted(axes[2]) != spatial or len(set(axes[0]) | set(axes[1])) != len(extents):
        return None
    return (*axes, extents)


def pad_widths(func):
    """(pad_width as R.nn.pad takes it, pad value) of topi's constant pad, else None."""
    found = _only_block(func)
    if found is None or len(func.params) != 2 or not str(func.params[0].dtype).startswith("float"):
        return None
    block, extents = found
    src, out = func.params
    store = block.body
    if not isinstance(store, tirx.BufferStore) or not store.buffer.same_as(out) or block.init is not None:
        return None
    if _positions(store.indices, block) != list(range(len(extents))):
        return None
    value, fill = store.value, None
    guarded = getattr(getattr(value, "op", None), "name", None) == "prim.if_then_else"
    # topi.nn.pad's block (its guard, inside ? x[i - before] : value, is not read back)
    if guarded and block.name_hint == "PadInput" and isinstance(value.args[2], tirx.FloatImm):
        value, fill = value.args[1], float(value.args[2].value)
    if _load(value, src) is None or len(value.indices) != len(extents):
        return None
    widths = []
    for index, var, size, total in zip(value.indices, block.iter_vars, src.shape, extents):
        before = 0
        if isinstance(index, tirx.Sub) and isinstance(index.b, tirx.IntImm):
            index, before = index.a, int(index.b)
        if not index.same_as(var.var) or not isinstance(size, tirx.IntImm) or before < 0:
            return None
        widths += [before, total - int(size) - before]
    if min(widths) < 0 or (fill is None) != (max(widths) == 0):
        return None
    return widths, fill or 0.0


def _matmul_of(bb, a, b, axes):
    """a, b contracted as `axes` says (einsum_axes), as R.matmul with permutes and reshapes around it."""
    a_ax, b_ax, out_ax, extents = axes
    batch = [v for v in out_ax if v in a_ax and v in b_ax]
    m = [v for v in out_ax if v in a_ax and v not in b_ax]
    n = [v for v in out_ax if v in b_ax and v not in a_ax]
    k = [v for v in a_ax if v in b_ax and v not in out_ax]
    if not k or sorted(a_ax) != sorted(batch + m + k) or sorted(b_ax) != sorted(batch + k + n):
        return None
    size = [extents[v] for v in batch]

    def arranged(x, have, order, shape):
        perm = [have.index(v) for v in order]
        if perm != list(range(len(perm))):
            x = bb.emit(relax.op.permute_dims(x, perm))
        if [extents[v] for v in order] != shape:
            x = bb.emit(relax.op.reshape(x, shape))
        return x

    a = arranged(a, a_ax, batch + m + k, size + [math.prod(extents[v] for v in m), math.prod(extents[v] for v in k)])
    b = arranged(b, b_ax, batch + k + n, size + [math.prod(extents[v] for v in k), math.prod(extents[v] for v in n)])
    out = relax.op.matmul(a, b)
    shape = [extents[v] for v in batch + m + n]
    if len(m) != 1 or len(n) != 1:
        out = relax.op.reshape(bb.emit(out), shape)
    perm = [(batch + m + n).index(v) for v in out_ax]
    return out if perm == list(range(len(perm))) else relax.op.permute_dims(bb.emit(out), perm)


@mutator
class _Lift(PyExprMutator):
    def __init__(self, mod):
        super().__init__(mod)
        self.mod_ = mod
        self.lifted = {}

    def visit_call_(self, call):
        call = self.visit_expr_post_order(call)
        if getattr(call.op, "name", None) != "relax.call_tir" or len(call.args) != 2:
            return call
        func = self.mod_.functions.get(call.args[0]) if isinstance(call.args[0], relax.GlobalVar) else None
        args = list(getattr(call.args[1], "fields", ()))
        new = None
        if isinstance(func, tirx.PrimFunc) and len(args) == 2 and einsum_axes(func) is not None:
            new = _matmul_of(self.builder_, *args, einsum_axes(func))
        elif isinstance(func, tirx.PrimFunc) and len(args) == 1 and pad_widths(func) is not None:
            widths, fill = pad_widths(func)
            new = args[0] if max(widths) == 0 else relax.op.nn.pad(args[0], widths, pad_value=fill)
        if new is None or not tvm_ffi.structural_equal(self.builder_.normalize(new).ty, call.ty):
            return call  # the permutes/reshapes above, if any, are left for DeadCodeElimination
        kind = "einsum" if len(args) == 2 else "pad"
        self.lifted[kind] = self.lifted.get(kind, 0) + 1
        return new


def lift_tir_calls(mod):
    """(mod, {"einsum": n, "pad": n}): main's liftable call_tirs as Relax ops (module doc); `mod`
    itself when there were none."""
    lifter = _Lift(mod)
    main = lifter.visit_expr(mod["main"])
    if not lifter.lifted:
        return mod, {}
    mod = mod.clone()
    mod["main"] = main
    return relax.transform.DeadCodeElimination()(mod), lifter.lifted
