"""Load and check an ONNX model, fix dynamic dims, import it into TVM Relax."""
from __future__ import annotations

import contextlib
import io
import logging
import os
import re
from dataclasses import dataclass

import numpy as np

from ..errors import TunekitError

log = logging.getLogger("tunekit")

_ONNX_TO_NUMPY = {1: "float32", 2: "uint8", 3: "int8", 5: "int16", 6: "int32", 7: "int64", 9: "bool", 10: "float16", 11: "float64"}


@dataclass
class ModelInputs:
    shapes: dict[str, list[int]]
    dtypes: dict[str, str]

    def random(self, *, seed: int = 0) -> dict[str, np.ndarray]:
        """Inputs for timing and numerics checks; int inputs (token ids) stay small and valid."""
        rng = np.random.default_rng(seed)
        out = {}
        for name, shape in self.shapes.items():
            dtype = self.dtypes[name]
            if dtype.startswith("int") or dtype.startswith("uint"):
                out[name] = rng.integers(0, 2, size=shape).astype(dtype)
            elif dtype == "bool":
                out[name] = np.ones(shape, dtype=bool)
            else:
                out[name] = rng.standard_normal(shape).astype(dtype)
        return out


def parse_input_shapes(specs: list[str] | None) -> dict[str, list[int]]:
    """['x:1x3x224x224', ...] -> {'x': [1, 3, 224, 224]}"""
    shapes = {}
    for spec in specs or []:
        name, sep, dims = spec.rpartition(":")
        try:
            if not sep or not name:
                raise ValueError
            shape = [int(d) for d in dims.lower().split("x")]
            if any(d <= 0 or d > 1_000_000 for d in shape):
                raise ValueError
        except ValueError:
            raise TunekitError(f"--input-shape {spec!r}: expected NAME:DxDxD with positive integers, e.g. x:1x3x224x224") from None
        shapes[name] = shape
    return shapes


def load_onnx(path: str):
    import onnx

    if not os.path.isfile(path):
        raise TunekitError(f"ONNX file not found: {path}")
    try:
        model = onnx.load(path)
        onnx.checker.check_model(path)  # from the file: checking the loaded model serializes it first (1 s for BERT)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise TunekitError(f"{path} is not a valid ONNX model: {first[:200]}") from None
    if not model.graph.node:
        raise TunekitError(f"{path} has an empty graph")
    newest = onnx.defs.onnx_opset_version()
    for opset in model.opset_import:
        if opset.domain in ("", "ai.onnx") and opset.version > newest:
            # onnx's checker lets an unknown future opset through; operators would be read by rules
            # they were not written for.
            raise TunekitError(f"{path} declares ONNX opset {opset.version}, newer than the newest this "
                               f"installation knows ({newest})")
    return model


def model_inputs(model, overrides: dict[str, list[int]]) -> ModelInputs:
    initializers = {init.name for init in model.graph.initializer}
    graph_inputs = [i for i in model.graph.input if i.name not in initializers]
    unknown = set(overrides) - {i.name for i in graph_inputs}
    if unknown:
        names = ", ".join(i.name for i in graph_inputs)
        raise TunekitError(f"--input-shape names unknown input(s) {sorted(unknown)}; the model's inputs are: {names}")
    shapes, dtypes = {}, {}
    for inp in graph_inputs:
        tensor_type = inp.type.tensor_type
        dtypes[inp.name] = _ONNX_TO_NUMPY.get(tensor_type.elem_type, "float32")
        if inp.name in overrides:
            shapes[inp.name] = overrides[inp.name]
            continue
        dims = []
        for dim in tensor_type.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value > 0:
                dims.append(dim.dim_value)
            else:
                # A batch-like leading dynamic dim defaults to 1; anything else must be given.
                if not dims:
                    dims.append(1)
                    continue
                raise TunekitError(f"input {inp.name!r} has a dynamic dimension {dim.dim_param or '?'}; "
                                   f"fix it with --input-shape {inp.name}:" + "x".join(["N"] * len(tensor_type.shape.dim)))
        shapes[inp.name] = dims
    for name, dims in shapes.items():
        # A batch-1 model input beyond 2^31 elements is a typo or a hostile file, not a workload:
        # refuse it before anything tries to allocate it.
        if int(np.prod(dims, dtype=np.float64)) > 2**31:
            raise TunekitError(f"input {name!r} has an absurd shape {dims} (over 2^31 elements); "
                               f"fix it with --input-shape {name}:...")
    return ModelInputs(shapes, dtypes)


def import_to_relax(model, inputs: ModelInputs):
    """The ONNX model in Relax. When TVM's importer fails, once more with the graph's shape
    computations folded by onnxruntime (frontend.onnx_fold); the first error is the one reported."""
    from .onnx_fold import fold_shapes

    try:
        return _with_static_shapes(model, inputs, _from_onnx(model, inputs))
    except _ImportFailed as exc:
        first = exc
    try:
        relax_mod = _from_onnx(fold_shapes(model, inputs.shapes), inputs)
    except Exception:
        pass
    else:
        log.info("TVM's importer failed on the model as exported (%s); imported it with its shape "
                 "computations folded", first.summary())
        return relax_mod
    text = first.summary()
    if "not supported" in text.lower() or "unsupported" in text.lower() or "not implemented" in text.lower():
        ops = sorted({n.op_type for n in model.graph.node})
        raise TunekitError(f"TVM cannot import this model: {text[:300]} (operators in the model: {', '.join(ops)})")
    raise TunekitError(f"TVM could not import the model: {text[:300]}")


def _with_static_shapes(model, inputs: ModelInputs, relax_mod):
    """`relax_mod`, or the model imported again with its shape computations folded when that leaves fewer
    tensors of unknown shape. TVM's importer keeps a shape computed in the graph (torch.chunk's Shape ->
    Gather -> Div -> Slice, a Reshape to a Concat of Gathers) as a run-time value, so what follows has
    no static shape: `emit_te` then refuses it when the module is prepared, and MetaSchedule cannot
    measure a task with symbolic shapes. The model's input shapes are fixed, so those are constants."""
    from .onnx_fold import fold_shapes

    unknown = unknown_shapes(relax_mod)
    if not unknown:
        return relax_mod
    try:
        folded = _from_onnx(fold_shapes(model, inputs.shapes), inputs)
    except Exception as exc:  # the model as imported still tunes where its shapes are static
        why = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        log.info("%d tensors of unknown shape (%s, ...); folding the model's shape computations failed: %s",
                 len(unknown), unknown[0], why)
        return relax_mod
    left = unknown_shapes(folded)
    log.info("%d tensors of unknown shape after import (%s, ...); %d with the model's shape computations folded",
             len(unknown), unknown[0], len(left))
    return folded if len(left) < len(unknown) else relax_mod


def unknown_shapes(relax_mod) -> list[str]:
    """The Relax variables of `relax_mod` whose shape is not a constant (unknown or symbolic)."""
    from tvm import relax
    from tvm.relax.analysis import all_vars

    found = []
    for func in relax_mod.functions.values():
        if isinstance(func, relax.Function):
            found += [v.name for v in all_vars(func) if not _static_type(v.ty)]
    return found


def _static_type(ty) -> bool:
    from tvm import relax, tirx

    if isinstance(ty, relax.TensorType):
        return isinstance(ty.shape, relax.ShapeExpr) and all(isinstance(d, tirx.IntImm) for d in ty.shape.values)
    if isinstance(ty, relax.ShapeType):
        return ty.values is not None and all(isinstance(d, tirx.IntImm) for d in ty.values)
    if isinstance(ty, relax.TupleType):
        return all(_static_type(field) for field in ty.fields)
    return True


class _ImportFailed(Exception):
    def __init__(self, error: Exception, printed: str):
        super().__init__(str(error))
        self.error, self.printed = error, printed

    def summary(self) -> str:
        """One line: which operator TVM failed on (it prints that, and raises e.g. a bare AssertionError), and why."""
        lines = str(self.error).strip().splitlines()
        why = " ".join(lines[-3:]) if lines else type(self.error).__name__
        op = re.search(r"Error converting operator (\w+)", self.printed)
        return f"converting operator {op.group(1)} failed: {why}" if op else why


def _from_onnx(model, inputs: ModelInputs):
    """TVM's ONNX importer. Its `print` of the operator it failed on goes to stdout, where a user would
    read "Error converting operator" above a run that went on to succeed (and into `--json` output): keep it."""
    from tvm.relax.frontend.onnx import from_onnx

    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), _not_checked_again():
            return from_onnx(model, shape_dict=inputs.shapes, dtype_dict=inputs.dtypes)
    except Exception as exc:
        raise _ImportFailed(exc, printed.getvalue()) from None


@contextlib.contextmanager
def _not_checked_again():
    """TVM's importer runs onnx's checker on the model it is given, only to warn, and serializes the model for it
    (hundreds of MB for GPT-2, twice when the import is done again folded); load_onnx checked the file already."""
    import onnx.checker

    check = onnx.checker.check_model
    onnx.checker.check_model = lambda *args, **kwargs: None
    try:
        yield
    finally:
        onnx.checker.check_model = check
