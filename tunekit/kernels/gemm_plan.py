"""Which tasks are a GEMM another kernel can compute, and what that kernel must do around it.

A task's PrimFunc qualifies when its one reduction block is a matmul of a row-major A (its rows may span several
axes: [1, H, W, C] activations are H x W rows) and a 2-D B, accumulated in fp32 from fp16 (or fp32) inputs, followed
only by elementwise blocks over the same output: the casts, bias adds, activations and residual adds that fusion put
after it. frontend.split_k's partial sums qualify too (`splits`). The plan says where A, B and the output are among
the function's parameters, and states the elementwise blocks as Triton statements over the fp32 accumulator `acc` and
the tiles `e<i>` of the other parameters they read, each a matrix like the output, a row or a column vector. Anything
else (a batched B, a reduction after the GEMM, an index that is not the element's own) has no plan, and the task
keeps MetaSchedule's kernels alone.
"""
from __future__ import annotations

import dataclasses

_TRITON_DTYPES = {"float16": "tl.float16", "float32": "tl.float32", "bfloat16": "tl.bfloat16"}
# Triton's math takes fp32: each call's argument goes up to fp32 and its value back to the call's dtype
_CALLS = {"tirx.exp": "tl.exp({})", "tirx.sqrt": "tl.sqrt({})", "tirx.erf": "tl.erf({})",
          "tirx.tanh": "(2.0 * tl.sigmoid(2.0 * {}) - 1.0)", "tirx.sigmoid": "tl.sigmoid({})",
          "tirx.fabs": "tl.abs({})", "tirx.rsqrt": "tl.rsqrt({})", "tirx.log": "tl.log({})"}


@dataclasses.dataclass(frozen=True)
class Operand:
    """A parameter the epilogue reads: its index among the function's parameters and how it is indexed by the
    output's row and column: "mn" (a matrix like the output), "n" (one value per column), "m" (per row)."""

    param: int
    indexed_by: str
    dtype: str


@dataclasses.dataclass(frozen=True)
class GemmPlan:
    m: int
    n: int
    k: int
    a: int            # parameter index of A, [.., M, K] row-major
    b: int            # parameter index of B: [K, N], or [N, K] when b_transposed
    b_transposed: bool
    out: int          # parameter index of the output, [.., M, N]
    in_dtype: str
    out_dtype: str
    operands: tuple[Operand, ...]  # what the epilogue reads, e0, e1, ... in order
    epilogue: tuple[str, ...]  # Triton statements t<j> = ... of acc (fp32), e<i> and earlier t<j>, one a block
    result: str       # the name whose value, cast to out_dtype, is the output
    # split-K (frontend.split_k): the output is [splits, M, N] of partial sums, split s over K rows [s k, (s + 1) k)
    splits: int = 1

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k * self.splits

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> GemmPlan:
        return cls(**{**data, "operands": tuple(Operand(**o) for o in data["operands"]),
                      "epilogue": tuple(data["epilogue"])})


def plan_of(func) -> GemmPlan | None:
    """The GEMM plan of a task's PrimFunc, or None when it is not one (see the module's docstring)."""
    try:
        return _plan(func)
    except _NotGemm:
        return None


class _NotGemm(Exception):
    pass


def _require(condition: bool) -> None:
    if not condition:
        raise _NotGemm()


def _plan(func) -> GemmPlan:
    import tvm

    root = getattr(func.body, "block", None)
    _require(root is not None and root.name_hint == "root")  # a hand-written kernel has none
    sch = tvm.s_tir.Schedule(tvm.IRModule({"main": func}))
    blocks = [sch.get(rv) for rv in sch.get_child_blocks(sch.get_sblock("root"))]
    _require(bool(blocks))
    buffers = list(func.params)  # TVM 0.27: a PrimFunc's parameters are its buffers
    param_of = _ParamIndex(buffers)
    gemm, rest = blocks[0], blocks[1:]
    m, n, k, splits, a, b, b_transposed, acc_buf, in_dtype = _matmul(gemm, param_of)
    _require(splits == 1 or not rest)  # split-K partial sums go out as they are
    extents = [int(iv.dom.extent) for iv in gemm.iter_vars if iv.iter_type == 0]
    values = {acc_buf.name: "acc"}  # an intermediate buffer (by name) -> the name of its value in Triton
    statements: list[str] = []
    operands: list[Operand] = []
    last = acc_buf
    for block in rest:
        store = block.body
        _require(isinstance(store, tvm.tirx.BufferStore) and block.init is None)
        ivs = list(block.iter_vars)
        _require(all(iv.iter_type == 0 for iv in ivs) and [int(iv.dom.extent) for iv in ivs] == extents)
        _require(_rows_index(store.indices, ivs))
        _require(param_of.index(store.buffer) in (None, len(buffers) - 1))
        statements.append(f"t{len(statements)} = {_expr(store.value, values, ivs, param_of, operands)}")
        values[store.buffer.name] = f"t{len(statements) - 1}"
        last = store.buffer
    out = param_of.index(last)
    _require(out == len(buffers) - 1)
    out_buf = buffers[out]
    # the indices follow the iteration (checked), so a shape of as many elements is that row-major layout
    _require(str(out_buf.dtype) in _TRITON_DTYPES and _product(out_buf.shape) == splits * m * n
             and int(out_buf.shape[-1]) == n)
    return GemmPlan(m=m, n=n, k=k, a=a, b=b, b_transposed=b_transposed, out=out, in_dtype=in_dtype,
                    out_dtype=str(out_buf.dtype), operands=tuple(operands), epilogue=tuple(statements),
                    result=values[last.name], splits=splits)


def _product(values) -> int:
    out = 1
    for v in values:
        out *= int(v)
    return out


class _ParamIndex:
    """A buffer's index among the function's parameters (by identity), or None for an intermediate."""

    def __init__(self, buffers):
        self._buffers = buffers

    def index(self, buf) -> int | None:
        return next((i for i, b in enumerate(self._buffers) if b.same_as(buf)), None)


def _matmul(block, param_of):
    """(M, N, K, splits, A's parameter, B's parameter, B transposed, the accumulator's buffer, the inputs' dtype).
    M is the output's rows, however many axes they span ([1, 56, 56, C] activations: 3136 rows); K is one split's when
    the block is split-K's (a leading spatial axis s whose K rows start at s K)."""
    import tvm
    from tvm.ir.prim import expr as E

    ivs = list(block.iter_vars)
    _require(len(ivs) >= 3 and all(iv.iter_type == 0 for iv in ivs[:-1]) and ivs[-1].iter_type == 2)
    vn, vk = ivs[-2].var, ivs[-1].var
    n, k = int(ivs[-2].dom.extent), int(ivs[-1].dom.extent)
    store = block.body
    _require(isinstance(store, tvm.tirx.BufferStore) and str(store.buffer.dtype) == "float32")
    _require(block.init is not None and isinstance(block.init.value, E.FloatImm) and float(block.init.value.value) == 0)
    value = store.value
    _require(isinstance(value, E.Add) and _is_load(value.a) and value.a.source.same_as(store.buffer)
             and isinstance(value.b, E.Mul))
    loads = [_uncast(x) for x in (value.b.a, value.b.b)]
    _require(all(_is_load(x) for x in loads))
    a_load, b_load = loads
    lead = ivs[:-2]
    split = lead[0] if len(lead) >= 2 and int(lead[0].dom.extent) > 1 and \
        _split_k_index(a_load.indices[-1], lead[0].var, vk, k) else None
    rows = lead[1:] if split is not None else lead
    splits = int(split.dom.extent) if split is not None else 1

    def k_index(index) -> bool:  # the K row: k itself, or split s's k-th (s * K + k)
        if split is None:
            return _same_vars([index], [vk])
        return _split_k_index(index, split.var, vk, k)

    _require(_rows_index(store.indices, ([split] if split is not None else []) + rows + [ivs[-2]]))
    _require(k_index(a_load.indices[-1]) and _rows_index(a_load.indices[:-1], rows))
    _require(len(b_load.indices) == 2)
    if k_index(b_load.indices[0]) and _same_vars(b_load.indices[1:], [vn]):
        transposed = False
    else:
        _require(_same_vars(b_load.indices[:1], [vn]) and k_index(b_load.indices[1]))
        transposed = True
    a, b = param_of.index(a_load.source), param_of.index(b_load.source)
    _require(a is not None and b is not None and str(a_load.source.dtype) == str(b_load.source.dtype)
             and str(a_load.source.dtype) in ("float16", "float32"))
    m = _product(iv.dom.extent for iv in rows)
    _require(_product(a_load.source.shape) == m * k * splits and int(a_load.source.shape[-1]) == k * splits)
    return m, n, k, splits, a, b, transposed, store.buffer, str(a_load.source.dtype)


def _split_k_index(index, vs, vk, k: int) -> bool:
    """Whether `index` is vs * k + vk (in either order)."""
    from tvm.ir.prim import expr as E

    if not isinstance(index, E.Add):
        return False
    for scaled, plain in ((index.a, index.b), (index.b, index.a)):
        if _same_vars([plain], [vk]) and isinstance(scaled, E.Mul):
            for var, const in ((scaled.a, scaled.b), (scaled.b, scaled.a)):
                if _same_vars([var], [vs]) and isinstance(const, E.IntImm) and int(const.value) == k:
                    return True
    return False


def _is_load(x) -> bool:
    return type(x).__name__ == "TensorLoad"  # a buffer's element (tvm.ir.expr.TensorLoad in TVM 0.27)


def _uncast(x):
    import tvm

    return x.value if isinstance(x, tvm.tirx.Cast) and _dtype(x) == "float32" else x


def _dtype(expr) -> str:
    return str(expr.ty.dtype)


def _same_vars(indices, variables) -> bool:
    import tvm

    return len(indices) == len(variables) and all(isinstance(i, tvm.tirx.Var) and i.same_as(v)
                                                  for i, v in zip(indices, variables))


def _is_zero(index) -> bool:
    from tvm.ir.prim import expr as E

    return isinstance(index, E.IntImm) and int(index.value) == 0


def _rows_index(indices, ivs) -> bool:
    """Whether `indices` address a buffer by `ivs` in order, row-major: each index its iter var (or 0 where that has
    extent 1), after any leading zeros of axes the iteration does not have."""
    indices = list(indices)
    while len(indices) > len(ivs) and _is_zero(indices[0]):
        indices.pop(0)
    return len(indices) == len(ivs) and all(
        _same_vars([i], [iv.var]) or (_is_zero(i) and int(iv.dom.extent) == 1) for i, iv in zip(indices, ivs))


def _expr(node, values: dict, ivs, param_of, operands: list) -> str:
    """`node` (an elementwise block's value) as Triton source over the tile."""
    import tvm
    from tvm.ir.prim import expr as E

    def walk(x) -> str:
        if _is_load(x):
            return _load(x)
        if isinstance(x, tvm.tirx.Cast):
            _require(_dtype(x) in _TRITON_DTYPES)
            return f"({walk(x.value)}).to({_TRITON_DTYPES[_dtype(x)]})"
        if isinstance(x, (E.FloatImm, E.IntImm)):
            return repr(float(x.value))
        for kind, template in ((E.Add, "({} + {})"), (E.Sub, "({} - {})"), (E.Mul, "({} * {})"),
                               (E.Div, "({} / {})"), (E.Max, "tl.maximum({}, {})"), (E.Min, "tl.minimum({}, {})")):
            if isinstance(x, kind):
                return template.format(walk(x.a), walk(x.b))
        if isinstance(x, E.Select):
            return f"tl.where({walk(x.condition)}, {walk(x.true_value)}, {walk(x.false_value)})"
        for kind, symbol in ((E.LT, "<"), (E.LE, "<="), (E.GT, ">"), (E.GE, ">=")):
            if isinstance(x, kind):
                return f"({walk(x.a)} {symbol} {walk(x.b)})"
        if isinstance(x, tvm.ir.expr.Call) and getattr(x.op, "name", None) in _CALLS and len(x.args) == 1:
            _require(_dtype(x) in _TRITON_DTYPES)
            inner = _CALLS[x.op.name].format(f"({walk(x.args[0])}).to(tl.float32)")
            return f"({inner}).to({_TRITON_DTYPES[_dtype(x)]})"
        raise _NotGemm()

    def _load(x) -> str:
        source = x.source
        if param_of.index(source) is None:  # an intermediate: only what an earlier block wrote
            _require(source.name in values and _rows_index(x.indices, ivs))
            return values[source.name]
        param = param_of.index(source)
        _require(str(source.dtype) in _TRITON_DTYPES)
        rows, n = ivs[:-1], int(ivs[-1].dom.extent)
        m, dims = _product(iv.dom.extent for iv in rows), [int(d) for d in source.shape]
        # the indices follow the iteration (checked first), so a shape of as many elements is that row-major layout
        if _rows_index(x.indices, ivs) and _product(dims) == m * n and dims[-1] == n:
            by = "mn"
        elif _rows_index(x.indices, ivs[-1:]) and _product(dims) == n:
            by = "n"
        elif _rows_index(x.indices, rows) and _product(dims) == m:
            by = "m"
        else:
            raise _NotGemm()
        found = next((i for i, o in enumerate(operands) if o.param == param and o.indexed_by == by), None)
        if found is None:
            operands.append(Operand(param, by, str(source.dtype)))
            found = len(operands) - 1
        return f"e{found}"

    return walk(node)
