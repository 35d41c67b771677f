"""Does a compiled model still compute the model? Its outputs against onnxruntime's fp32 on CPU.

Per output: max abs error, max rel error (the max abs error over the reference's largest
magnitude, so elements near zero do not turn rounding noise into huge ratios) and cosine
similarity. `tune` refuses an artifact past the bound of its precision, in one line that names
the output, the error and the way out; `evaluate` and `bench --compare-onnx` report the same rows.

The bounds (docs/running.md, "Behaviour"): fp32 builds agree with onnxruntime to rounding; fp16 inputs with
fp32 accumulation keep about three significant digits per layer, and the error grows with depth.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .errors import RunFailed, TunekitError


@dataclass(frozen=True)
class Bound:
    max_rel_err: float   # max |out - ref| / max |ref|
    min_cosine: float

    def to_dict(self) -> dict:
        return asdict(self)


# fp16: max rel error <= 5e-2 and cosine >= 0.999. The bound is there to catch a broken build, not fp16's
# rounding, so it is set where PyTorch's own fp16 and TF32 outputs land against onnxruntime fp32; a tighter
# bound refused good fp16 builds, and broken kernels land far outside (benchmarks/RESULTS.md, "fp16 bounds").
BOUNDS = {"fp32": Bound(max_rel_err=1e-3, min_cosine=0.99999), "fp16": Bound(max_rel_err=5e-2, min_cosine=0.999)}

# One kernel against another kernel of the same task on the same fp16 inputs (clients.session_runner): only
# rounding and summation order may differ, so far less than a whole model's fp16 error.
KERNEL_BOUND = Bound(max_rel_err=1e-2, min_cosine=0.9999)


def bound_for(precision: str, *, max_output_error: float | None = None,
              min_output_cosine: float | None = None) -> Bound:
    """The gate's bound at `precision`, with a run's config overrides (None keeps the default)."""
    default = BOUNDS[precision]
    return Bound(max_rel_err=default.max_rel_err if max_output_error is None else max_output_error,
                 min_cosine=default.min_cosine if min_output_cosine is None else min_output_cosine)


def within(rows: list[dict], bound: Bound) -> bool:
    """Every output inside `bound`."""
    return all(_inside(row, bound) for row in rows)


def _inside(row: dict, bound: Bound) -> bool:
    return row["max_rel_err"] <= bound.max_rel_err and row["cosine"] >= bound.min_cosine  # NaN is not

# onnxruntime's input type names -> numpy dtypes (an fp16 artifact may take other dtypes than the graph)
_ORT_DTYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
               "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8",
               "tensor(uint8)": "uint8", "tensor(bool)": "bool"}


def onnxruntime_outputs(model, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The ONNX model's (a path or a ModelProto) outputs on CPU, in the graph's output order."""
    import onnxruntime as ort

    source = model if isinstance(model, str) else model.SerializeToString()
    label = model if isinstance(model, str) else "the ONNX model"
    try:
        session = ort.InferenceSession(source, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime's errors are its own types; one line is what the user needs
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise TunekitError(f"onnxruntime cannot load {label}: {first[:300]}") from None
    feed = {}
    for arg in session.get_inputs():
        if arg.name not in inputs:
            raise TunekitError(f"{label} takes an input {arg.name!r} that the compiled model does not; "
                               f"is it the model the artifact was built from?")
        value = inputs[arg.name]
        feed[arg.name] = value.astype(_ORT_DTYPES.get(arg.type, value.dtype.name), copy=False)
    return session.run(None, feed)


def compare(actual, reference) -> dict:
    """max_abs_err, max_rel_err and cosine of one output, in float64."""
    a = np.asarray(actual, dtype=np.float64).ravel()
    b = np.asarray(reference, dtype=np.float64).ravel()
    if a.shape != b.shape:
        return {"max_abs_err": float("inf"), "max_rel_err": float("inf"), "cosine": 0.0,
                "error": f"shapes differ: {list(np.shape(actual))} vs {list(np.shape(reference))}"}
    diff = np.abs(a - b)
    max_abs = float(diff.max()) if diff.size else 0.0
    scale = float(np.abs(b).max()) if b.size else 0.0
    norms = float(np.linalg.norm(a) * np.linalg.norm(b))
    cosine = float(a @ b / norms) if norms > 0 else (1.0 if not a.any() and not b.any() else 0.0)
    row = {"max_abs_err": max_abs, "max_rel_err": max_abs / scale if scale > 0 else max_abs, "cosine": cosine,
           "reference_max_abs": scale}
    bad = {"nonfinite": int(a.size - np.isfinite(a).sum()), "reference_nonfinite": int(b.size - np.isfinite(b).sum())}
    return {**row, **bad} if any(bad.values()) else row  # which side holds the NaN or Inf, where one does


def compare_outputs(names: list[str], outputs: list, reference: list) -> list[dict]:
    """One row per output (matched by position): its name, shape and the errors."""
    if len(outputs) != len(reference):
        raise TunekitError(f"the compiled model has {len(outputs)} outputs but the reference {len(reference)}; "
                           "is it the model the artifact was built from?")
    return [{"name": name, "shape": list(np.shape(out)), **compare(out, ref)}
            for name, out, ref in zip(names, outputs, reference)]


# fp16's smallest normal number. A model whose fp32 outputs all lie below it has activations that fp16 flushes
# to zero or to a few bits, so an fp16 build returns near-zeros (cosine 0), however it is scheduled. Seen as a
# user: torchvision's MobileNetV2 with fresh weights and BatchNorm never calibrated has logits of ~1e-9.
FP16_SMALLEST_NORMAL = float(np.finfo(np.float16).tiny)


def _underflow_hint(row: dict, precision: str) -> str:
    """Why an fp16 output cannot be right, when the reference itself is below fp16's range."""
    scale = row.get("reference_max_abs")
    if precision != "fp16" or not scale or scale >= FP16_SMALLEST_NORMAL:  # an all-zero output is no underflow
        return ""
    return (f"; onnxruntime's {row['name']!r} is at most {scale:.2g} in magnitude, below fp16's range "
            f"({FP16_SMALLEST_NORMAL:.2g}), so the model's values underflow in fp16 (untrained weights?)")


class NumericsRefused(RunFailed):
    """An artifact's outputs are past its precision's bound (`check`)."""


def check(rows: list[dict], *, precision: str, bound: Bound | None = None, what: str = "the tuned model") -> None:
    """Refuse, in one line, an artifact whose outputs are past the bound of its precision."""
    bound = bound or BOUNDS[precision]
    for row in rows:
        rel, cosine = row["max_rel_err"], row["cosine"]
        if not _inside(row, bound):
            way_out = "; tune with --precision fp32" if precision != "fp32" else " (bounds: max_output_error, min_output_cosine)"
            raise NumericsRefused(f"{what} is refused: output {row['name']!r} differs from onnxruntime's fp32 by "
                            f"{rel:.3g} (max rel error, bound {bound.max_rel_err:g}) with cosine {cosine:.6f} "
                            f"(bound {bound.min_cosine:g}) at {precision}{_underflow_hint(row, precision)}"
                            f"{way_out}")
