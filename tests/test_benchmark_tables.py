"""The benchmark scripts' own arithmetic: what a committed table claims comes from these functions."""
import importlib
import json
import os
import sys

import pytest

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


def _benchmark(name):
    sys.path.insert(0, BENCHMARKS)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(BENCHMARKS)


@pytest.fixture(scope="module")
def scaling():
    return _benchmark("coordinator_scaling")


def _row(label, trials, wall):
    return {"label": label, "ray": True, "clients": 2, "servers": 2, "cores": 16, "tuning_wall_s": wall,
            "process_wall_s": wall + 90, "trials": trials, "trials_per_s": round(trials / wall, 3),
            "tuned_ms": 0.5, "tuned_std_ms": 0.01, "cpu_speed": [100.0, 90.0]}


def test_a_setup_run_twice_is_pooled_over_its_runs_and_compared_with_the_first(scaling):
    """Runs in the order 1, 2, 2, 1 GPUs (a drift of the machine's speed falls on both setups): each setup's
    trials/s is all its trials over all its tuning walls, not the mean of its runs' rates."""
    rows = [_row("2 client(s) x 2 server(s) x 1 GPU(s)", 768, 160.0),
            _row("4 client(s) x 2 server(s) x 2 GPU(s)", 768, 100.0),
            _row("4 client(s) x 2 server(s) x 2 GPU(s) (run 2)", 768, 92.0),
            _row("2 client(s) x 2 server(s) x 1 GPU(s) (run 2)", 768, 180.0),
            {**_row("1 process, no Ray", 768, 300.0), "ray": False}]  # not a coordinator setup: not pooled
    one, two = scaling.pooled(rows)
    assert (one["setup"], one["runs"], one["trials"], one["tuning_wall_s"]) == \
        ("2 client(s) x 2 server(s) x 1 GPU(s)", 2, 1536, 340.0)
    assert two["trials_per_s"] == round(1536 / 192.0, 3) and two["each_trials_per_s"] == [7.68, 8.348]
    text = scaling.table(rows)
    assert f"| {two['trials_per_s'] / one['trials_per_s']:.2f}x |" in text.splitlines()[-1]  # 1.77x
    assert "| 1.00, 0.90 |" in text  # each setup's CPU speed before and after, against the first's before
    # one run of each: no pooled table
    assert "pooled" not in scaling.table(rows[:2])


@pytest.fixture(scope="module")
def build_compile():
    return _benchmark("build_compile")


def _build_run(workers, built, wall, total):
    phases = {f"{k}_per_candidate_s": total if k == "total" else 0.1 for k in ("total", "passes", "nvrtc",
                                                                              "codegen", "export")}
    return {"workers": workers, "mode": "lean", "wall_s": wall, "built": built, "failed": 0,
            "candidates_per_s": round(built / wall, 2), "profile": phases}


def test_build_scaling_pools_a_worker_count_over_its_runs_and_compares_with_the_fewest(build_compile):
    """16, 32, 32, 16 workers: each count's rate is all its candidates over all its walls, and the per-worker
    column says how much of a worker's rate is left when twice the workers build at once."""
    runs = [_build_run(16, 96, 12.0, 1.2), _build_run(32, 96, 8.0, 1.6), _build_run(32, 96, 7.0, 1.8),
            _build_run(16, 96, 13.0, 1.4)]
    sixteen, thirty_two = build_compile.scaling_rows(runs)
    assert (sixteen["workers"], sixteen["runs"], sixteen["built"], sixteen["wall_s"]) == (16, 2, 192, 25.0)
    assert thirty_two["candidates_per_s"] == round(192 / 15.0, 3)
    assert thirty_two["vs_smallest"] == round((192 / 15.0) / (192 / 25.0), 3)  # 1.67x
    assert thirty_two["per_worker_vs_smallest"] == round(25.0 / 15.0 / 2, 3)
    assert thirty_two["per_candidate_s"]["total"] == 1.7
    table = build_compile.scaling_table([sixteen, thirty_two])
    assert "| 32 | 2 | 192 | 0 | 15.0 | 12.8 (12.0, 13.71) | 1.67x | 0.83 |" in table


def test_worker_seconds_per_candidate_weigh_each_client_by_its_candidates(scaling):
    """The builds' own cost over all clients: a client that built 300 candidates at 0.9 s counts three times
    one that built 100 at 0.5 s; a client without a profile (a stock engine, an older report) is left out."""
    profiles = [{"candidates": 300, "total_per_candidate_s": 0.9}, {"candidates": 100, "total_per_candidate_s": 0.5},
                None, {"candidates": 0, "total_per_candidate_s": 0.0}]
    assert scaling.worker_s_per_candidate(profiles) == 0.8
    assert scaling.worker_s_per_candidate([None]) is None
    row = {**_row("4 client(s) x 2 server(s) x 2 GPU(s)", 768, 100.0), "search_s_per_trial": 0.25,
           "build_s_per_trial": 0.6, "worker_s_per_candidate": 0.8, "shards_in_flight": [3.62, 2.71, None],
           "shards_sent_ahead": [12, 0, None], "wait_s_per_trial": 0.1}
    assert "| 0.250, 0.600, 0.100; 0.800 | 3.6 (12 ahead), 2.7 |" in scaling.table([row])
    # the searches behind the search seconds, and when each client last drew from the pool beside when it was done
    row.update(searches=32, search_s=200.0, shards_done_s=[90.4, 81.0], shards_last_draw_s=[40.2, None])
    table = scaling.table([row])
    assert "| 0.250 (32 searches, 6.2 s each), 0.600, 0.100; 0.800 |" in table
    assert "| 90 (40), 81 |" in table


def test_the_fleet_benchmark_finds_when_every_model_first_reaches_its_solo_latency(tmp_path):
    fleet = _benchmark("fleet")
    solo = [1.0, 2.0]
    curve = [(100.0, [1.5, 2.0]), (200.0, [1.01, 2.5]), (300.0, [1.019, 2.03]), (400.0, [0.9, 1.9])]
    assert fleet.reached_at(curve, solo, tolerance=0.02) == 300.0  # both within 2% only from the third point
    assert fleet.reached_at(curve, solo, tolerance=0.0) == 400.0
    assert fleet.reached_at(curve[:2], solo, tolerance=0.02) is None
    members = [fleet.Member("a.onnx", "gpu", 40, 1.0, "a"), fleet.Member("b.onnx", "gpu", 60, 3.0, "b")]
    runs = {"fleet": {"curve": curve, "trials": 90, "wall_s": 400.0},
            "sequential": {"curve": [(300.0, [1.0, 3.0]), (800.0, [1.0, 2.0])], "trials": 80, "wall_s": 800.0,
                           "estimated_ms": solo}}
    text = fleet.table(members, runs, {"fleet": [0.9, 1.9], "sequential": solo}, tolerance=0.02)
    row = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in text.splitlines()
           if line.startswith("| fleet") or line.startswith("| sequential")}
    assert row["fleet"][2:4] == ["6.6000", f"{6.6 / 7.0:.3f}"]  # weighted 0.9 + 3 x 1.9 against 1.0 + 3 x 2.0
    assert row["fleet"][6:] == ["300", f"{300 / 800:.3f}"] and row["sequential"][6:] == ["800", "1.000"]
    # each model's own wall to its solo latency, and the longest stretch before it in which it stood still while the
    # other model fell (the fleet's trials went elsewhere)
    curve = [(100.0, [3.0, 4.0]), (150.0, [2.0, 4.0]), (200.0, [1.5, 4.0]), (250.0, [1.0, 3.0]), (300.0, [1.0, 2.0])]
    assert fleet.model_reached_at(curve, 0, 1.0, tolerance=0.0) == 250.0
    assert fleet.model_reached_at(curve, 1, 2.0, tolerance=0.0) == 300.0
    assert fleet.longest_flat(curve, 1, until=300.0) == (100.0, 200.0)
    assert fleet.longest_flat(curve, 0, until=250.0) == (0.0, 0.0)
    assert fleet.longest_flat(curve, 1, until=180.0) == (100.0, 150.0)
    runs["fleet"]["curve"] = curve
    runs["fleet"]["trials_curve"] = [(90.0, [0, 8]), (140.0, [8, 8]), (190.0, [16, 10]), (240.0, [24, 26])]
    runs["sequential"]["estimated_ms"] = [1.0, 2.0]
    text = fleet.per_model_table(members, runs, tolerance=0.0)
    assert "| a | 250 (0 s, 0 trials) | 300 (0 s) |" in text, text
    assert "| b | 300 (100 s, 2 trials) | 800 (0 s) |" in text, text
    # each model's trials over time, from its tasks' batches (report tasks[].measured_at)
    a = {"tasks": [{"measured_at": [[1010.0, 4], [1030.0, 8]]}, {"measured_at": [[1020.0, 4]]}]}
    b = {"tasks": [{"measured_at": [[1025.0, 2]]}, {}]}
    assert fleet.trials_curve([a, b], 1000.0) == [(10.0, [4, 0]), (20.0, [8, 0]), (25.0, [8, 2]), (30.0, [12, 2])]
    # the curve from two reports: each model's tasks' weighted sum, every task at its untuned time until it fell
    a = {"tasks": [{"weight": 2, "untuned_us": 500.0, "fell_at": [[1010.0, 400.0], [1030.0, 300.0]]},
                   {"weight": 1, "untuned_us": None, "fell_at": [[1020.0, 100.0]]}]}
    b = {"tasks": [{"weight": 1, "untuned_us": 800.0, "fell_at": []}, {"weight": 3, "untuned_us": 50.0}]}
    assert fleet.estimated_curve([a, b], 1000.0) == [(10.0, [0.9, 0.95]), (20.0, [0.9, 0.95]), (30.0, [0.7, 0.95])]
    assert fleet.estimated_ms(a["tasks"], 1005.0) == 1.1 and fleet.estimated_ms(a["tasks"]) == 0.7
    # tuned at once, each alone on its GPU (a from 1000 s for 40 s, b from 1003 s for 50 s), composed one after
    # another: b's falls move to after a's wall; a model not started yet is at its untuned latency
    b["tasks"][0]["fell_at"] = [[1013.0, 600.0]]
    moved = fleet.one_after_another([a, b], [1000.0, 1003.0], [40.0, 50.0])
    assert moved[0]["tasks"][0]["fell_at"] == [[10.0, 400.0], [30.0, 300.0]] and moved[1]["tasks"][0]["fell_at"] == [[50.0, 600.0]]
    assert fleet.estimated_curve(moved, 0.0) == [(10.0, [0.9, 0.95]), (20.0, [0.9, 0.95]), (30.0, [0.7, 0.95]),
                                                 (50.0, [0.7, 0.75])]
    # a fleet file's models with their own shares and weights, the file's share for those that name none
    path = tmp_path / "fleet.yaml"
    path.write_text("gpu_pct: 30\nmodels:\n  - a.onnx\n  - {model: b.onnx, gpu_pct: 70, weight: 2, name: bee}\n")
    assert fleet.members_of(str(path)) == [fleet.Member(str(tmp_path / "a.onnx"), "gpu", 30, 1.0, "m0"),
                                           fleet.Member(str(tmp_path / "b.onnx"), "gpu", 70, 2.0, "bee")]


def test_stack_samples_reads_back_the_main_threads_frames_and_their_seconds(tmp_path):
    """A real faulthandler dump (two samples of a process sleeping in two functions of a tunekit module) read back."""
    import subprocess

    out = tmp_path / "stacks.txt"
    script = ("import faulthandler, time, sys\n"
              f"sink = open({str(out)!r}, 'w'); faulthandler.dump_traceback_later(0.5, repeat=True, file=sink)\n"
              "def first(): time.sleep(1.2)\n"
              "def second(): time.sleep(1.0)\n"
              "first(); second()\n")
    (tmp_path / "tunekit").mkdir()
    (tmp_path / "tunekit" / "sampled.py").write_text(script)
    subprocess.run([sys.executable, str(tmp_path / "tunekit" / "sampled.py")], check=True, timeout=60,
                   cwd=str(tmp_path))
    lines = _benchmark("stack_samples").timeline(out.read_text())
    assert len(lines) >= 3
    seconds = [float(line.split()[0]) for line in lines]
    assert seconds == sorted(seconds) and seconds[-1] >= 1
    assert "tunekit/sampled.py:3 first" in lines[0] and "tunekit/sampled.py:4 second" in lines[-1]


def test_the_gemm_table_takes_the_fastest_triton_kernel_within_the_fp16_bound():
    """benchmarks/gemm_kernels.py: a faster configuration whose output is wrong is not the best; a task with no
    right Triton kernel has no row."""
    gemm = _benchmark("gemm_kernels")
    rows = [{"share": "gpu40", "task": "qkv", "kind": "dlight", "config": "untuned", "median_us": 20.0},
            {"share": "gpu40", "task": "qkv", "kind": "triton", "config": "fast-wrong", "median_us": 5.0,
             "tflops": 400.0, "of_share_peak": 1.0, "max_abs_err": 0.5, "ref_max": 3.0},
            {"share": "gpu40", "task": "qkv", "kind": "triton", "config": "m64n64k32w4s3g8", "median_us": 10.0,
             "tflops": 100.0, "of_share_peak": 0.25, "max_abs_err": 0.001, "ref_max": 3.0},
            {"share": "gpu40", "task": "fc2", "kind": "dlight", "config": "untuned", "median_us": 20.0},
            {"share": "gpu40", "task": "fc2", "error": "no GEMM plan"}]
    lines = gemm.table(rows).splitlines()
    assert len(lines) == 3 and "| gpu40 | qkv | 20.00 | m64n64k32w4s3g8 | 10.00 | 0.500 | 100.0 | 0.25 |" == lines[2]


def test_a_gemm_tiles_floor_counts_its_grids_waves_at_one_sms_share_of_the_peak(tmp_path, capsys):
    """gemm_layouts.py --floors: a grid that fits the SMs is one wave of padded tiles, one past them several; the
    saved run's table (--table, no GPU) sets the best tile against its floor and the lowest floor of the tiles."""
    gemm = _benchmark("gemm_layouts")
    row = {"share": "gpu40", "shape": "197x768x2304", "layout": "kn", "out_dtype": "float16", "sm_count": 52,
           "gpu": "NVIDIA H200", "cublas_us": 7.0, "best": "m128n128k32w4s4g8", "best_us": 7.0, "best_tflops": 99.6,
           "tiles": {"m128n128k32w4s4g8": [7.0, 0.0], "m64n64k64w4s3g8": [8.0, 0.0]},
           "empty_kernel_us": 1.0, "copy_gbps": 3000.0, "bytes": 4749312}
    per_sm = 520.0 / 52 * 1e6  # FLOP/µs at one SM of a 520 TFLOP/s share
    # 2 x 18 = 36 programs on 52 SMs: one wave of 128 x 128 tiles; 4 x 36 = 144: three waves of 64 x 64
    big, small = 1.0 + 2 * 128 * 128 * 768 / per_sm, 1.0 + 3 * 2 * 64 * 64 * 768 / per_sm
    assert gemm.tile_floor_us(row, "m128n128k32w4s4g8", 520.0) == pytest.approx(big)
    assert gemm.tile_floor_us(row, "m64n64k64w4s3g8", 520.0) == pytest.approx(small)
    saved = tmp_path / "gemm.json"
    saved.write_text(json.dumps({"rows": [row]}))
    gemm.main(["--table", str(saved)])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert line.startswith("| gpu40 | 197x768x2304 | [K, N] | float16 | m128n128k32w4s4g8 | 7.0 |")
    cells = [c.strip() for c in line.strip("|").split("|")]
    h200_share = 989.4 * 52 / 132
    assert cells[12] == f"{gemm.tile_floor_us(row, 'm128n128k32w4s4g8', h200_share):.2f}"
    assert cells[14] == f"{gemm.tile_floor_us(row, 'm64n64k64w4s3g8', h200_share):.2f}" != cells[12]


def test_the_gemm_benchmark_times_fc2_both_split_along_k_and_whole(tmp_path):
    """gemm_kernels.py's fc2 is the partial-sum task of the split tunekit makes; fc2_whole the same layer unsplit
    (prepare(split_k=False)), so the two can be compared with Triton's kernels."""
    pytest.importorskip("onnx")
    from tvm.target import Target

    gemm = _benchmark("gemm_kernels")
    m, k, n, activation, _ = gemm.layers(40, 64, 1024)["fc2"]
    path = gemm.dense_onnx(str(tmp_path / "fc2.onnx"), m, k, n, activation)
    split = gemm.gemm_task(path, Target("nvidia/nvidia-h100"))[1]
    whole = gemm.gemm_task(path, Target("nvidia/nvidia-h100"), split_k=False)[1]
    assert (split.splits, split.k * split.splits) == (4, 1024) and (whole.splits, whole.k) == (1, 1024)
    assert whole.operands and not split.operands  # the bias joins the whole kernel; the split one sums only


def test_pytorchs_best_is_its_fastest_correct_variant_and_tunekit_is_also_set_against_the_whole_gpu():
    """vs_pytorch.table: at 40% PyTorch's fp16 is the fastest but wrong (MPS on Hopper), so its fp32 is the best there;
    at 100% torch.compile's max-autotune is. tunekit at 40% is set against both."""
    vs = _benchmark("vs_pytorch")
    right = [{"max_rel_err": 0.002, "cosine": 0.999999}]
    wrong = [{"max_rel_err": 0.9, "cosine": 0.69}]

    def row(ms, errors):
        return {"median_ms": ms, "errors": errors}

    state = {"machine": "NVIDIA H200, 580; 16 CPU cores; Python 3.12", "models": {"vit_b_16": {
        "pytorch": {"gpu40": {"graphs-fp32": row(1.4, right), "graphs-fp16": row(0.75, wrong)},
                    "gpu100": {"graphs-fp16": row(0.70, right), "maxautotune-fp16": row(0.64, right)}},
        "tunekit": {"gpu40": {"untuned_ms": 4.8, "checkpoints": [{"budget_s": 90, "trials": 48, "tuned_ms": 0.672}]}}}}}
    text = vs.table(state)
    head = next(line for line in text.splitlines() if line.startswith("| model"))
    assert "PyTorch max-autotune fp16" in head and "compile" not in head and "eager" not in head
    gpu40 = next(line for line in text.splitlines() if line.startswith("| vit_b_16 | gpu40")).split(" | ")
    assert gpu40[3] == "0.750†" and gpu40[5] == "1.400"  # the wrong fp16 is shown, marked, and not the best
    assert gpu40[-2] == f"{0.672 / 1.4:.3f}" and gpu40[-1].rstrip(" |") == f"{0.672 / 0.64:.3f}"
    gpu100 = next(line for line in text.splitlines() if line.startswith("| vit_b_16 | gpu100")).split(" | ")
    assert gpu100[5] == "0.640"
