"""End to end, as a user runs it: tune (CLI, --json) -> records -> compile -> evaluate; and the Python API."""
import json
import os

import pytest

from tunekit.testing import QUICK_SEARCH, run_cli

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tuned(example_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("tune") / "cpu50"
    proc = run_cli("tune", example_model, "--cpu-pct", "50", "--trials", "16", "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out, json.loads(proc.stdout)


def test_tune_writes_records_artifact_and_consistent_report(tuned):
    out, result = tuned
    report = json.load(open(out / "report.json"))
    assert report == json.loads(json.dumps(result["report"]))  # --json prints what report.json holds
    assert report["share"] == "cpu50" and report["environment"]["share_enforced"] is True
    cores = report["environment"]["cores_at_share"]
    assert len(cores) == max(1, round(len(os.sched_getaffinity(0)) / 2)) and set(cores) <= os.sched_getaffinity(0)
    assert os.path.isfile(report["artifact"]) and os.path.isdir(report["records_dir"])
    assert os.path.basename(report["records_dir"]) == "records-cpu50"  # one database per share
    assert report["trials"]["measured"] >= 16 and report["trials"]["failed"] == 0
    lat = report["latency_ms"]
    assert lat["tuned"]["median_ms"] > 0 and lat["untuned"]["median_ms"] > 0
    assert any(t["tuned_us"] for t in report["tasks"])


def test_fleets_and_build_workers_start_beside_the_untuned_model(tuned):
    """LocalExecutor.warm_up: the servers and the build workers were started while the untuned model
    was compiled and timed, and tuning took them over."""
    warm = tuned[1]["report"]["phases"]["warm_up"]
    assert warm["before_tuning"] is True and warm["took_s"] > 0 and warm["tuning_waited_s"] >= 0
    # where the warm-up went: the fleets, then the engine, within its time; on a CPU share it also
    # waited for the build workers, made with the engine, to start
    steps = warm["steps"]
    assert set(steps) == {"fleets_s", "engine_s", "build_workers_s"} and min(steps.values()) > 0
    assert steps["fleets_s"] + steps["engine_s"] <= warm["took_s"] + 0.01
    assert steps["build_workers_s"] <= warm["took_s"] - steps["fleets_s"] + 0.01


def test_a_refused_untuned_model_leaves_no_warm_up_behind(example_model, tmp_path):
    """The numerics gate refuses the untuned model while the warm-up's servers and build workers run:
    they are stopped with the run, not left behind."""
    import psutil

    import tunekit

    from tunekit.testing import new_children

    before = {p.pid for p in psutil.Process().children(recursive=True)}
    with pytest.raises(tunekit.RunFailed, match="refused"):
        tunekit.tune(example_model, cpu_pct=50, out=str(tmp_path / "o"),
                     config=tunekit.TuneConfig(trials=2, max_output_error=1e-12))
    assert not new_children(before)


def test_server_log_is_kept_in_the_out_dir(tuned):
    """A one-process run writes its runner servers' log under <out>/work/logs/, not to a temp file."""
    out, result = tuned
    logs = sorted((out / "work" / "logs").glob("*-servers.log"))
    assert [p.name for p in logs] == ["tunekit-cpu50-servers.log"], logs
    assert logs[0].stat().st_size > 0  # the server wrote to it (its start-up at least)


def test_records_summary_matches_report(tuned):
    out, result = tuned
    proc = run_cli("records", out, "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)["cpu50"]
    assert summary["trials"] == result["report"]["trials"]["measured"]
    # the best latency per task in the report is the best in the records
    best_in_records = sorted(round(w["best_us"], 3) for w in summary["per_workload"] if w["best_us"])
    best_in_report = sorted(t["tuned_us"] for t in result["report"]["tasks"] if t["tuned_us"])
    assert best_in_records == pytest.approx(best_in_report, rel=1e-3)
    # the compiled model's metadata: the share, and built from exactly these records
    artifact = json.loads(proc.stdout)["artifacts"][os.path.basename(result["report"]["artifact"])]
    assert artifact["share"] == "cpu50" and artifact["records_current"] is True
    assert artifact["tuned_trials"] == summary["trials"] and artifact["inputs"][0]["name"] == "x"


def test_compile_and_evaluate_match_onnxruntime(tuned, example_model, tmp_path):
    out, _ = tuned
    lib = tmp_path / "m.so"
    proc = run_cli("compile", example_model, "--records", out, "--out", lib, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert os.path.getsize(lib) > 0
    proc = run_cli("evaluate", example_model, "--records", out, "--cpu-pct", "50,100", "--repeats", "5", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)["results"]
    assert [(r["tuned_at"], r["run_at"]) for r in rows] == [("cpu50", "cpu50"), ("cpu50", "cpu100")]
    assert all(r["numerics_ok"] and r["median_ms"] > 0 for r in rows)


def test_python_api_and_yaml_config(example_model, tmp_path):
    import yaml

    import tunekit
    from tunekit.config import TuneConfig, load_yaml_config

    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(yaml.safe_dump({"trials": 8, "trials_per_iter": 8, "measure_repeats": 5, "search": QUICK_SEARCH}))
    config = TuneConfig(**load_yaml_config(str(cfg_path)))
    result = tunekit.tune(example_model, cpu_pct=100, out=str(tmp_path / "api"), config=config)
    assert isinstance(result, tunekit.TuneResult)
    assert result.share == "cpu100" and result.records_dir.endswith("records-cpu100")
    assert result.trials >= 8 and os.path.isfile(result.artifact)
    with pytest.raises(TypeError):
        tunekit.tune(example_model, 100)  # keyword-only


@pytest.mark.gpu
def test_gpu_tune_at_40_percent_sees_fewer_sms(example_model, tmp_path):
    proc = run_cli("tune", example_model, "--gpu-pct", "40", "--trials", "16", "--out", tmp_path / "g", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    env = json.loads(proc.stdout)["report"]["environment"]
    assert env["share_enforced"] and env["sm_count_at_share"] is not None
    import tvm

    assert env["sm_count_at_share"] < tvm.cuda(0).multi_processor_count
    # the servers launch kernels from a core of their own; the builds and the search stay off it
    phases = json.loads(proc.stdout)["report"]["phases"]
    assert phases["pipeline"]["depth"] == 4  # the CUDA default (TuneConfig.pipeline_depth_for)
    import os

    if len(os.sched_getaffinity(0)) >= 4:
        assert len(phases["measurement_cores"]) == 1
        assert not set(phases["measurement_cores"]) & set(phases["build_cores"])


@pytest.mark.gpu
def test_gpu_precision_auto_falls_back_to_fp32_when_fp16_is_refused(example_model, tmp_path):
    """A bound of 1e-5 holds for an fp32 build (rounding: about 1e-7 against onnxruntime) and not for
    fp16 (about 1e-3): `auto` picks fp16 on a tensor-core GPU, the gate refuses its untuned build, and
    the share is tuned in fp32; `--precision fp16` with the same bound is refused in one line."""
    config = tmp_path / "tight.yaml"
    config.write_text("max_output_error: 1.0e-5\n")
    proc = run_cli("tune", example_model, "--gpu-pct", "40", "--trials", "4", "--config", config,
                   "--out", tmp_path / "auto", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["report"]
    assert report["precision"] == "fp32"
    assert "untuned fp16 model is refused" in report["precision_fallback"]
    assert report["trials"]["measured"] > 0 and report["session_failures"] == 0  # the fp32 candidates ran
    assert report["numerics"]["tuned"][0]["max_rel_err"] <= 1e-5
    assert json.load(open(tmp_path / "auto" / "records-gpu40" / "tunekit-run.json"))["precision"] == "fp32"

    proc = run_cli("tune", example_model, "--gpu-pct", "40", "--trials", "4", "--config", config,
                   "--precision", "fp16", "--out", tmp_path / "fp16")
    assert proc.returncode == 1
    assert "refused" in proc.stderr and "--precision fp32" in proc.stderr


@pytest.mark.gpu
def test_gpu_precision_auto_falls_back_at_every_share_of_one_search(example_model, tmp_path):
    """Two shares tuned by one search fall back together. The largest share is measured first; its
    fp32 fallback was compiled over the untuned build the other share then reused, so 40% passed
    the gate with the fp32 build, tuned in fp16, and its tuned model was refused (rc 1)."""
    config = tmp_path / "tight.yaml"
    config.write_text("max_output_error: 1.0e-5\n")
    proc = run_cli("tune", example_model, "--gpu-pct", "40,100", "--trials", "4", "--time-budget", "60", "--config",
                   config, "--out", tmp_path / "two", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for label in ("gpu40", "gpu100"):
        report = json.load(open(tmp_path / "two" / f"report-{label}.json"))
        assert report["precision"] == "fp32", label
        assert report["trials"]["measured"] > 0, label
        assert "untuned fp16 model is refused" in report["precision_fallback"], label
        assert report["numerics"]["tuned"][0]["max_rel_err"] <= 1e-5, label
        identity = json.load(open(tmp_path / "two" / f"records-{label}" / "tunekit-run.json"))
        assert identity["precision"] == "fp32", label
