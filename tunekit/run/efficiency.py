"""Each task's efficiency at its share: the FLOP/s and bytes/s its kernel reaches, against the roofline of the share
(the GPU's peak and memory bandwidth scaled to the SMs the share has), and which kind of kernel runs. It says which
tasks are far from what the share can do (a GEMM at 8% of the tensor-core peak, say) and whether that is compute or
memory. The bytes are a kernel's parameters once from memory: a kernel whose operands stay in the L2 cache between
the runs that time it can pass the memory roof (a fraction above 1)."""
from __future__ import annotations

from dataclasses import dataclass

from ..kernels.candidates import other_kind


@dataclass(frozen=True)
class DevicePeak:
    sms: int
    tensor_fp16_tflops: float  # dense, fp32 accumulation
    fp16_tflops: float         # CUDA cores
    fp32_tflops: float
    bandwidth_gbps: float


# NVIDIA's datasheets, SXM parts, dense (https://www.nvidia.com/en-us/data-center/h100/ and .../h200/)
PEAKS = {"H200": DevicePeak(132, 989.4, 133.8, 66.9, 4800.0),
         "H100 80GB HBM3": DevicePeak(132, 989.4, 133.8, 66.9, 3350.0)}


def device_peak(gpu_name: str | None) -> DevicePeak | None:
    """The peaks of a GPU named like nvidia-smi names it, or None for one not in PEAKS."""
    return next((peak for key, peak in PEAKS.items() if gpu_name and key in gpu_name), None)


def annotate_efficiency(tasks: list[dict], *, gpu_name: str | None, sm_count: int | None,
                        precision: str) -> dict | None:
    """Adds `efficiency` to each task row that has its FLOPs, bytes and a kernel time (the tuned kernel where its
    record is applied, else the untuned one) and returns the share's roofline; None where it is not known (a CPU
    share, a GPU not in PEAKS)."""
    peak = device_peak(gpu_name)
    if peak is None or not sm_count:
        return None
    part = min(1.0, sm_count / peak.sms)
    bandwidth = peak.bandwidth_gbps * part
    for row in tasks:
        other = other_kind(row.get("kernel"))
        tuned = other or bool(row.get("tuned_us")) and row.get("record_applied", True) and not row.get("fallback")
        us = row.get("kernel_us") if other else row.get("tuned_us") if tuned else row.get("untuned_us")
        if not us or (row.get("flops") or 0) <= 1.0 or not row.get("bytes"):  # 1.0: TVM could not count them
            continue
        tensor_cores = other or tuned and bool(row.get("best_tensorized"))
        compute = part * (peak.tensor_fp16_tflops if tensor_cores else
                          peak.fp16_tflops if precision == "fp16" else peak.fp32_tflops)
        memory = row["flops"] / row["bytes"] * bandwidth / 1e3  # TFLOP/s the bandwidth allows at its intensity
        achieved = row["flops"] / us / 1e6
        row["efficiency"] = {
            "kernel": row["kernel"] if other else ("tuned, tensor cores" if tensor_cores else "tuned") if tuned
            else "untuned",
            "achieved_tflops": _digits(achieved, 6), "achieved_gbps": _digits(row["bytes"] / us / 1e3, 5),
            "bound": "compute" if compute <= memory else "memory",
            "roofline_fraction": _digits(achieved / min(compute, memory), 4)}
    return {"gpu": gpu_name, "sm_count": sm_count, "of_sms": peak.sms,
            "peak_tflops": {"tensor_fp16": round(peak.tensor_fp16_tflops * part, 1),
                            "fp16": round(peak.fp16_tflops * part, 1), "fp32": round(peak.fp32_tflops * part, 1)},
            "bandwidth_gbps": round(bandwidth, 1)}


def _digits(value: float, significant: int) -> float:
    """Rounded to `significant` digits: a tiny kernel's fraction of the roofline is small, never 0."""
    return float(f"{value:.{significant}g}")
