"""Each task's efficiency against the roofline of its share (tunekit/run/efficiency.py)."""
from tunekit.run.efficiency import PEAKS, annotate_efficiency

# ViT-B/16's fc1 at 40% of an H200 as issue 53 measured it: 197 x 768 -> 3072 in fp16 in 29.2 us
M, K, N = 197, 768, 3072
FC1 = {"name": "fused_matmul_add_gelu", "flops": 2.0 * M * K * N, "bytes": 2 * (M * K + K * N + N + M * N),
       "untuned_us": 120.0, "tuned_us": 29.2, "best_tensorized": True, "record_applied": True}


def test_a_tuned_gemm_is_held_to_the_tensor_core_peak_and_bandwidth_of_its_share():
    rows = [dict(FC1), {**FC1, "name": "kept", "record_applied": False, "fallback": "its tuned kernel broke it"},
            {**FC1, "name": "uncounted", "flops": 1.0}, {**FC1, "name": "simt", "best_tensorized": False}]
    roofline = annotate_efficiency(rows, gpu_name="NVIDIA H200", sm_count=52, precision="fp16")
    part = 52 / 132
    assert roofline["peak_tflops"]["tensor_fp16"] == round(989.4 * part, 1)
    assert roofline["bandwidth_gbps"] == round(4800 * part, 1)
    achieved = FC1["flops"] / 29.2e-6 / 1e12
    memory = FC1["flops"] / FC1["bytes"] * 4800 * part / 1e3  # TFLOP/s at its arithmetic intensity
    fc1 = rows[0]["efficiency"]
    assert fc1["kernel"] == "tuned, tensor cores" and abs(fc1["achieved_tflops"] - achieved) < 1e-3
    assert fc1["bound"] == ("memory" if memory < 989.4 * part else "compute")
    assert abs(fc1["roofline_fraction"] - achieved / min(memory, 989.4 * part)) < 1e-4
    assert 0.05 < fc1["roofline_fraction"] < 0.2  # "about 8% of the tensor-core peak", and under the bandwidth roof
    kept = rows[1]["efficiency"]  # its record is not applied: the untuned kernel runs, on CUDA cores
    assert kept["kernel"] == "untuned" and abs(kept["achieved_tflops"] - FC1["flops"] / 120e-6 / 1e12) < 1e-3
    assert "efficiency" not in rows[2]  # TVM could not count its FLOPs
    simt = rows[3]["efficiency"]
    assert simt["kernel"] == "tuned" and simt["bound"] == "compute"
    assert abs(simt["roofline_fraction"] - achieved / (133.8 * part)) < 1e-4


def test_a_tiny_kernel_is_a_small_fraction_of_the_roofline_not_none_of_it():
    rows = [{**FC1, "flops": 200.0, "bytes": 100, "tuned_us": 5.0}]  # an example transformer's cast, say
    annotate_efficiency(rows, gpu_name="NVIDIA H200", sm_count=52, precision="fp16")
    tiny = rows[0]["efficiency"]
    assert 0 < tiny["roofline_fraction"] < 1e-4 and tiny["achieved_tflops"] > 0 and tiny["achieved_gbps"] > 0


def test_no_roofline_where_the_peaks_are_not_known():
    rows = [dict(FC1)]
    assert annotate_efficiency(rows, gpu_name=None, sm_count=None, precision="fp32") is None  # a CPU share
    assert annotate_efficiency(rows, gpu_name="NVIDIA A10", sm_count=30, precision="fp16") is None
    assert "efficiency" not in rows[0] and "H100 80GB HBM3" in PEAKS
