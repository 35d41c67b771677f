"""Latency of a compiled model at a share, measured in a subprocess pinned to that share, and
(optionally) its numerics against onnxruntime.

The worker (tunekit.deploy.bench_worker) gets the share's pinned environment from a ShareSession:
on CPU its affinity and thread count, on a GPU the MPS daemon and CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
so what it measures is what the model gets in production at that share.
"""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import numpy as np

from ..errors import RunFailed, TunekitError
from ..shares.share import Share, share_kind
from .arrays import random_inputs
from .compat import DeviceSpec, check_build
from .locate import locate_artifact
from .metadata import ArtifactMetadata, read_metadata
from .npzfiles import read_npz, write_npz

_SHARE_KIND_FOR_DEVICE = {"cpu": "cpu", "cuda": "gpu"}


@dataclass
class BenchResult:
    artifact: str
    share: str
    share_enforced: bool         # False only with allow_unenforced_share when MPS was not usable
    device: str                  # "cpu:0", "cuda:0"
    repeats: int
    warmup: int
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    throughput_per_s: float      # calls per second one after another (1000 / mean_ms), at the compiled batch
    cores: int                   # CPU cores the worker was pinned to
    sm_count: int | None         # SMs the worker saw at the share (GPU)
    gpu_name: str | None
    tvm_version: str
    numerics: dict | None = None  # with compare_onnx: per output errors against onnxruntime (CPU)
    variant: str | None = None    # a share-robust artifact: the share whose schedules ran (timed at load)
    variant_median_ms: dict | None = None  # ... and each variant's time there

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def latency_stats(latencies_ms: list[float]) -> dict:
    """Percentiles, mean, spread and throughput (calls per second, one after another) of timed calls."""
    latencies = np.asarray(latencies_ms, dtype=np.float64)
    p50, p90, p99 = (float(v) for v in np.percentile(latencies, [50, 90, 99]))
    mean = float(latencies.mean())
    return {"p50_ms": p50, "p90_ms": p90, "p99_ms": p99, "mean_ms": mean, "std_ms": float(latencies.std()),
            "min_ms": float(latencies.min()), "throughput_per_s": 1e3 / mean if mean > 0 else float("inf")}


def bench_share(meta: ArtifactMetadata, *, gpu_pct, cpu_pct) -> Share:
    """The share to measure at: the one asked for, else the artifact's own, else the whole GPU
    (CUDA artifacts) or half the CPU cores (tunekit's default CPU share)."""
    if gpu_pct is not None or cpu_pct is not None:
        kind = share_kind(gpu_pct, cpu_pct)
        pct = gpu_pct if kind == "gpu" else cpu_pct
        try:
            share = Share(kind, int(pct))
        except (TypeError, ValueError):
            raise TunekitError(f"--{kind}-pct must be an integer in 1..100, got {pct!r}") from None
    elif meta.share:
        share = Share.from_label(meta.share)
    else:
        share = Share("gpu", 100) if meta.device_kind == "cuda" else Share("cpu", 50)
    expected = _SHARE_KIND_FOR_DEVICE[meta.device_kind]
    if share.kind != expected:
        flag = "--gpu-pct" if expected == "gpu" else "--cpu-pct"
        raise TunekitError(f"the artifact is compiled for {meta.device_kind}; measure it at a {expected} share "
                           f"({flag}), not {share.label}")
    return share


def bench(artifact: str, *, gpu_pct: int | None = None, cpu_pct: int | None = None, repeats: int = 100,
          warmup: int = 10, compare_onnx: str | None = None, allow_unenforced_share: bool = False,
          timeout_s: float = 600, variant: str | None = "auto") -> BenchResult:
    """Latency percentiles of `artifact` (a compiled model, a tune out dir holding one, or a loaded
    TunedModel, whose file is measured) at a share, in a subprocess pinned to it."""
    from ..run.session import ShareSession

    artifact = locate_artifact(getattr(artifact, "artifact", artifact))  # a path, a tune out dir, a TunedModel
    if repeats < 1 or warmup < 0:
        raise TunekitError(f"repeats must be >= 1 and warmup >= 0 (got {repeats} and {warmup})")
    if compare_onnx and not os.path.isfile(compare_onnx):
        raise TunekitError(f"ONNX file not found: {compare_onnx}")
    meta = read_metadata(artifact)
    share = bench_share(meta, gpu_pct=gpu_pct, cpu_pct=cpu_pct)
    # No CUDA call here: the worker checks the GPU (and its architecture) inside the MPS share.
    check_build(artifact, meta, DeviceSpec(meta.device_kind, 0))
    if share.kind == "gpu":
        from ..shares.mps import gpu_present  # NVML: opens no CUDA context

        if not gpu_present():
            raise TunekitError(f"{os.path.basename(artifact)} is a CUDA model and needs an NVIDIA GPU, "
                               f"but none was found")
    inputs = random_inputs(meta)
    with tempfile.TemporaryDirectory(prefix="tunekit-bench-") as tmp, \
            ShareSession(share, allow_unenforced=allow_unenforced_share) as session:
        seen, outputs = _run_worker(artifact, inputs=inputs, tmp=tmp, repeats=repeats, warmup=warmup,
                                    session=session, timeout_s=timeout_s, variant=variant)
        enforced = session.enforced
    result = BenchResult(
        artifact=artifact, share=share.label, share_enforced=enforced, device=seen["device"], repeats=repeats,
        warmup=warmup, **latency_stats(seen["latencies_ms"]), cores=int(seen["cores"]),
        sm_count=seen.get("sm_count"), gpu_name=seen.get("gpu_name"), tvm_version=meta.tvm_version,
        variant=seen.get("variant"), variant_median_ms=seen.get("variant_median_ms") or None)
    if compare_onnx:
        result.numerics = _numerics(compare_onnx, meta=meta, inputs=inputs, outputs=outputs)
    return result


def _run_worker(artifact: str, *, inputs: dict, tmp: str, repeats: int, warmup: int, session,
                timeout_s: float, variant: str | None) -> tuple[dict, dict]:
    request = {"artifact": os.path.abspath(artifact), "inputs": write_npz(os.path.join(tmp, "in.npz"), inputs),
               "outputs": os.path.join(tmp, "out.npz"), "repeats": repeats, "warmup": warmup, "variant": variant}
    request_path = os.path.join(tmp, "request.json")
    with open(request_path, "w") as fh:
        json.dump(request, fh)
    label = session.share.label
    try:
        proc = subprocess.run([sys.executable, "-m", "tunekit.deploy.bench_worker", request_path],
                              capture_output=True, text=True, timeout=timeout_s, **session.pinned.popen_kwargs())
    except subprocess.TimeoutExpired:
        raise RunFailed(f"the benchmark at {label} did not finish in {timeout_s:.0f} s") from None
    answer = _last_json_line(proc.stdout)
    if proc.returncode == 2 and answer and "error" in answer:
        raise TunekitError(answer["error"])
    if proc.returncode != 0 or answer is None:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RunFailed(f"the benchmark at {label} failed (exit {proc.returncode}): {tail[:300]}")
    return answer, read_npz(request["outputs"])


def _last_json_line(text: str) -> dict | None:
    lines = text.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def _numerics(onnx_path: str, *, meta: ArtifactMetadata, inputs: dict, outputs: dict) -> dict:
    from ..numerics import compare_outputs, onnxruntime_outputs
    from ..records.identity import model_digest

    return {"reference": "onnxruntime (CPUExecutionProvider)", "onnx": onnx_path,
            # False: the ONNX file is not the one the artifact was compiled from (differences expected)
            "same_model": model_digest(onnx_path) == meta.model_sha256,
            "outputs": compare_outputs(list(outputs), list(outputs.values()), onnxruntime_outputs(onnx_path, inputs))}
