"""A fleet (run.fleet): several models tuned by one search with one budget, a workload they share searched once
and its records serving every model that has it; a model that fails never stops the others."""
import json
import math
import os
from collections import Counter

import pytest

from tunekit.testing import record_keys, run_cli


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """Two tiny CNNs with the same convs and different heads (10 and 20 classes): their convs' and their pool's
    workloads are shared, their dense layers' are not."""
    from tunekit.models.examples import save_example

    root = tmp_path_factory.mktemp("fleet")
    return (save_example("tiny_cnn", str(root / "a.onnx"), seed=0),
            save_example("tiny_cnn", str(root / "b.onnx"), seed=1, classes=20))


def _write(path, text: str) -> str:
    with open(path, "w") as fh:
        fh.write(text)
    return str(path)


def test_a_fleet_file_gives_each_model_its_share_and_weight_and_fails_in_one_line(tmp_path):
    from tunekit.config import FleetModel, load_fleet_file
    from tunekit.errors import TunekitError

    path = _write(tmp_path / "fleet.yaml", "cpu_pct: 50\ntrials: 8\nmodels:\n  - a.onnx\n"
                                          "  - {model: sub/b.onnx, weight: 2.5, cpu_pct: 25, name: bee}\n")
    models, values = load_fleet_file(path)
    assert models == [FleetModel(model=str(tmp_path / "a.onnx")),
                      FleetModel(model=str(tmp_path / "sub/b.onnx"), cpu_pct=25, weight=2.5, name="bee")]
    assert values == {"cpu_pct": 50, "trials": 8}
    for text, said in (("models: []\n", "needs `models:`"), ("models:\n  - {model: a.onnx, speed: 1}\n", "speed"),
                       ("models:\n  - {model: a.onnx, weight: 0}\n", "weight must be a number > 0"),
                       ("models: [a.onnx]\ntrails: 8\n", "unknown key(s) ['trails']")):
        with pytest.raises(TunekitError, match=None) as caught:
            load_fleet_file(_write(tmp_path / "bad.yaml", text))
        assert said in str(caught.value) and "\n" not in str(caught.value)


def test_the_fleets_tasks_are_each_workload_once_weighted_by_model_weight_and_count(pair):
    from tunekit.run.fleet import WEIGHT_STEPS, member_names, merge_tasks
    from tunekit.config import FleetModel
    from tunekit.frontend.precision import prepare
    from tunekit.frontend.tasks import extract_tasks
    from tunekit.run.session import load_model
    from tunekit.targets import target_for
    from tunekit.shares.share import Share

    class Member:  # what merge_tasks reads of a fleet member: its weight and its share job's tasks
        def __init__(self, path, weight):
            self.entry, self.keys = FleetModel(model=path, weight=weight), {}
            target = target_for(Share("cpu", 100))
            prepared, _ = prepare(load_model(path).mod, target, precision="fp32")
            self.job = type("Job", (), {"tasks": extract_tasks(prepared, target)})()
            self.target = target

    a, b = Member(pair[0], 1.0), Member(pair[1], 3.0)
    merged = merge_tasks([a, b], target=a.target)
    shared = set(a.keys) & set(b.keys)
    assert len(shared) >= 3 and set(a.keys) != set(b.keys)  # the convs and the pool; not the dense layers
    assert len(merged) == len(set(a.keys) | set(b.keys)) and len({t.task_name for t in merged}) == len(merged)
    by_key = {key: task for key, task in zip(list(dict.fromkeys([*a.keys, *b.keys])), merged)}
    for key, task in by_key.items():
        expected = a.keys.get(key, (None, 0))[1] * 1.0 + b.keys.get(key, (None, 0))[1] * 3.0
        assert int(task.weight) == round(expected * WEIGHT_STEPS), (task.task_name, int(task.weight), expected)
    assert member_names([FleetModel(model="x/a.onnx"), FleetModel(model="y/a.onnx")]) == ["a", "a-2"]


def test_a_fleets_fused_attentions_are_tried_once_and_each_model_is_handed_their_kernel_records(tmp_path):
    """Two models with the same fused attention (and one with another): the fleet's search tries each once
    (ShareJob.fused_tasks), and each model's records take the kernel records of its own (fused_keys, write_subset)."""
    import sys

    from tvm.target import Target

    from tunekit.frontend.precision import prepare
    from tunekit.frontend.tasks import already_scheduled, extract_tasks
    from tunekit.kernels.in_module import task_key
    from tunekit.records import kernel_records
    from tunekit.records.kernel_records import KernelRecord
    from tunekit.records.subset import write_subset
    from tunekit.run.fleet import merge_fused
    from tunekit.run.session import load_model

    sys.path.insert(0, os.path.dirname(__file__))
    from test_attention import _attention_onnx

    target = Target("nvidia/nvidia-h100")

    class Member:  # what merge_fused reads of a fleet member: its share job's fused tasks
        def __init__(self, seq):
            prepared, _ = prepare(load_model(_attention_onnx(str(tmp_path / f"a{seq}.onnx"), seq=seq, dim=64)).mod,
                                  target, precision="fp16")
            self.job = type("Job", (), {"fused_tasks": [t for t in extract_tasks(prepared, target)
                                                        if already_scheduled(t)]})()

    a, b, c = Member(200), Member(200), Member(300)
    merged = merge_fused([a, b, c])
    assert len(merged) == 2 and a.fused_keys == b.fused_keys and len(a.fused_keys | c.fused_keys) == 2
    fleet_dir, own_dir = str(tmp_path / "fleet"), str(tmp_path / "own")
    for key in a.fused_keys | c.fused_keys:
        kernel_records.append(fleet_dir, KernelRecord(key, "handwritten", "handwritten", (1e-5,), True))
    assert task_key(merged[0].dispatched[0]["main"]) in a.fused_keys | c.fused_keys
    write_subset(fleet_dir, own_dir, set(a.fused_keys))
    assert {r.workload for r in kernel_records.read(own_dir)} == a.fused_keys


@pytest.mark.e2e
def test_a_fleet_searches_a_shared_workload_once_and_a_failing_model_stops_no_other(pair, tmp_path):
    """tunekit tune fleet.yaml: the shared workloads are searched once into the fleet's records, each model's
    records dir holds its workloads' records (the shared ones the same) and its artifact applies their best;
    the broken model's row says why, the exit code is 1, and --resume goes on from the fleet's records."""
    from tunekit.records.baselines import workload_key
    from tunekit.records.database import open_best_records
    from tunekit.records.jsonl import read_workloads

    broken = _write(tmp_path / "broken.onnx", "not an ONNX file")
    fleet = _write(tmp_path / "fleet.yaml", f"cpu_pct: 100\nmodels:\n  - {pair[0]}\n  - {{model: {pair[1]}, weight: 3}}\n"
                                            f"  - {broken}\n")
    out = tmp_path / "out"
    args = ("tune", fleet, "--trials", "12", "--trials-per-iter", "2", "--out", str(out), "--json")
    proc = run_cli(*args)
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1].startswith(
        "tunekit: error: 1 of 3 fleet models failed (the others are written): broken: prepare: "), proc.stderr[-2000:]
    payload = json.loads(proc.stdout)
    report = payload["report"]
    rows = {row["name"]: row for row in report["fleet"]}
    assert rows["broken"]["error"].startswith("prepare: ") and payload["failed"] == {"broken": rows["broken"]["error"]}
    assert report["models_tuned"] == 2 and report["tasks"]["shared"] >= 3
    assert report["tasks"]["searched"] == report["tasks"]["in_models"] - report["tasks"]["shared"]
    assert report["weighted_latency_ms"]["tuned"] == pytest.approx(rows["a"]["tuned_ms"] + 3 * rows["b"]["tuned_ms"],
                                                                   rel=1e-3)
    steps = report["command_s"]  # where the fleet's wall went, step by step; one process warms up beside the untuned
    assert set(steps) == {"prepare_s", "sessions_s", "untuned_s", "tasks_s", "tune_s", "finish_s"}
    assert all(t >= 0 for t in steps.values()) and sum(steps.values()) <= report["wall_s"]

    fleet_db = out / "records-cpu100"
    keys = Counter(record_keys(fleet_db))
    assert keys and max(keys.values()) == 1  # nothing measured twice: each shared workload had one search
    assert sum(keys.values()) == report["trials"]["measured"]["cpu100"] <= 12

    def best(db) -> dict:
        """{workload key: its best record's trace} of a records dir, as the compiler picks it."""
        return {workload_key(r.workload.mod): str(r.trace) for r in open_best_records(str(db)).get_all_tuning_records()}

    best_a, best_b = best(out / "a" / "records-cpu100"), best(out / "b" / "records-cpu100")
    both = set(best_a) & set(best_b)
    assert both and all(best_a[key] == best_b[key] for key in both)  # one search's best serves both
    held = {name: {row[0] for row in read_workloads(str(out / name / "records-cpu100"))} for name in ("a", "b")}
    assert held["a"] != held["b"] and held["a"] | held["b"] == {row[0] for row in read_workloads(str(fleet_db))}
    for name in ("a", "b"):
        model_report = json.load(open(out / name / "report.json"))
        applied = {t["workload_hash"] for t in model_report["tasks"] if t.get("record_applied")}
        assert applied and applied <= set(best_a if name == "a" else best_b)
        assert all(t["fleet_models"] for t in model_report["tasks"]) and model_report["numerics"]["tuned"][0]["cosine"] > 0.999
        assert os.path.getsize(rows[name]["artifact"]) > 0

    fleet_ok = _write(tmp_path / "fleet-ok.yaml", f"cpu_pct: 100\nmodels:\n  - {pair[0]}\n  - {{model: {pair[1]}, weight: 3}}\n")
    again = run_cli("tune", fleet_ok, "--trials", "4", "--trials-per-iter", "2", "--out", str(out), "--json", "--resume")
    assert again.returncode == 0, again.stderr[-3000:]
    assert len(record_keys(fleet_db)) > sum(keys.values())  # it went on from the fleet's records
    for name in ("a", "b"):  # and each model's records are again the fleet's of its workloads
        own = set(record_keys(out / name / "records-cpu100"))
        assert own and own == {k for k in record_keys(fleet_db) if k[0] in {w for w, _ in own}}


@pytest.mark.e2e
def test_a_model_refused_at_its_untuned_build_leaves_the_fleet_to_the_others(pair, tmp_path, monkeypatch):
    """The fleet plans its tasks and starts its warm-up beside the untuned builds; b's untuned model is refused, so
    the plan is made again without b's workloads (the warm-up started over: `warm_up_s`) and a alone is tuned."""
    from tunekit.clients.task_faults import ENV

    monkeypatch.setenv(ENV, "untuned_model:b")
    out = tmp_path / "out"
    proc = run_cli("tune", *pair, "--cpu-pct", "100", "--trials", "8", "--trials-per-iter", "2", "--out", str(out),
                   "--json")
    assert proc.returncode == 1, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["report"]
    rows = {row["name"]: row for row in report["fleet"]}
    assert rows["b"]["error"].startswith("untuned: InjectedFault: injected untuned_model failure"), rows["b"]
    assert report["models_tuned"] == 1 and "warm_up_s" in report["command_s"], report["command_s"]
    own = {key for key, _ in record_keys(out / "a" / "records-cpu100")}
    assert own and {key for key, _ in record_keys(out / "records-cpu100")} <= own  # nothing of b's own was searched


def test_a_fleet_at_two_shares_measures_a_workload_only_at_the_shares_of_its_models(pair, tmp_path):
    """One process, model a at cpu50 and model b at cpu100: the workloads both have are measured at both shares
    (each share's records hold them), each dense layer only at its own model's share."""
    # min_task_share 0: the dense layers (negligible in time) are tuned too
    fleet = _write(tmp_path / "fleet.yaml", f"oversubscribe: true\nmin_task_share: 0\nmodels:\n"
                                            f"  - {{model: {pair[0]}, cpu_pct: 50}}\n"
                                            f"  - {{model: {pair[1]}, cpu_pct: 100}}\n")
    out = tmp_path / "out"
    proc = run_cli("tune", fleet, "--trials", "12", "--trials-per-iter", "2", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["report"]
    assert report["models_tuned"] == 2 and sorted(report["shares"]) == ["cpu100", "cpu50"]

    def workloads(db) -> set:
        return {key for key, _ in record_keys(db)}

    at50, at100 = workloads(out / "records-cpu50"), workloads(out / "records-cpu100")
    of_a, of_b = workloads(out / "a" / "records-cpu50"), workloads(out / "b" / "records-cpu100")
    assert at50 == of_a and at100 == of_b  # nothing measured at a share whose model does not have it
    assert at50 & at100 and at50 - at100 and at100 - at50, (at50, at100)  # the shared convs at both, the heads apart
    assert report["trials"]["measured"]["cpu50"] < report["trials"]["measured"]["cpu100"] + 12


@pytest.mark.e2e
def test_a_fleet_tuned_in_one_process_weighs_the_faster_models_tasks_more(pair, tmp_path):
    """fleet_objective's default (auto) is the models' weighted geometric mean in one process: each task's gradient is
    scaled by sum(w / L) of the models that have it, so the faster model's own tasks are worth more per microsecond
    than the slower one's. Asked for through Ray clients, it is refused in one line; alone, too."""
    from tunekit.models.examples import save_example

    # two ResNet-18s about 14x apart (4x the channels, 4x the pixels): no workload shared, each task its model's own
    small = save_example("resnet18", str(tmp_path / "small.onnx"), width=8, image=32)
    large = save_example("resnet18", str(tmp_path / "large.onnx"), width=16, image=64)
    fleet = _write(tmp_path / "fleet.yaml", f"cpu_pct: 100\nmin_task_share: 0\nmodels:\n"
                                            f"  - {{model: {large}, name: large}}\n  - {{model: {small}, name: small}}\n")
    out = tmp_path / "out"
    proc = run_cli("tune", fleet, "--trials", "8", "--trials-per-iter", "2", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "experimental" not in proc.stderr
    report = json.loads(proc.stdout)["report"]
    rows = {row["name"]: row for row in report["fleet"]}
    fast, slow = "small", "large"
    assert report["objective"] == "geomean"
    assert report["weighted_geomean_ms"]["tuned"] == pytest.approx(
        math.sqrt(rows[fast]["tuned_ms"] * rows[slow]["tuned_ms"]), rel=1e-3)

    def own_priorities(name) -> list[float]:
        model_report = json.load(open(out / name / "report.json"))
        assert model_report["config"]["fleet_objective"] == "geomean"
        return [t["priority"] for t in model_report["tasks"] if t["fleet_models"] == [name] and "priority" in t]
    assert rows[slow]["tuned_ms"] > 4 * rows[fast]["tuned_ms"]
    assert own_priorities(fast) and own_priorities(slow)
    assert min(own_priorities(fast)) > 1 > max(own_priorities(slow)), (own_priorities(fast), own_priorities(slow))
    geomean = _write(tmp_path / "geomean.yaml", "fleet_objective: geomean\n")
    geomean_fleet = _write(tmp_path / "geomean-fleet.yaml", open(fleet).read() + "fleet_objective: geomean\n")
    refused = run_cli("tune", geomean_fleet, "--clients", "2", "--trials", "4", "--out", str(tmp_path / "ray"))
    assert refused.returncode != 0
    assert refused.stderr.strip().splitlines()[-1] == ("tunekit: error: fleet_objective 'geomean' needs the fleet's "
                                                       "search in one process of the tunekit engine (leave out "
                                                       "--clients and --engine stock)")
    alone = run_cli("tune", pair[0], "--cpu-pct", "100", "--config", geomean, "--trials", "4",
                    "--out", str(tmp_path / "one"))
    assert alone.returncode != 0 and alone.stderr.strip().splitlines()[-1] == (
        "tunekit: error: fleet_objective weighs a fleet's models: tune several at once (tunekit tune a.onnx b.onnx, "
        "or a fleet file)")


def test_a_fleet_through_ray_clients_searches_each_workload_once_at_its_share(pair, tmp_path):
    """--clients 2: the share's tasks (both models', each workload once) are sharded over two Ray tuning clients;
    their shards are merged into the fleet's records, and each model gets its workloads' records and artifact."""
    out = tmp_path / "ray"
    proc = run_cli("tune", *pair, "--cpu-pct", "100", "--clients", "2", "--trials", "12", "--trials-per-iter", "2",
                   "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["report"]
    assert report["models_tuned"] == 2 and report["tasks"]["shared"] >= 3 and report["objective"] == "sum"
    assert "warm_up_s" not in report["command_s"]  # the clients started beside the untuned builds
    assert report["tasks"]["per_share"]["cpu100"] == report["tasks"]["in_models"] - report["tasks"]["shared"]
    keys = Counter(record_keys(out / "records-cpu100"))
    assert keys and max(keys.values()) == 1 and sum(keys.values()) == report["trials"]["measured"]["cpu100"]
    for name in ("a", "b"):
        model_report = json.load(open(out / name / "report.json"))
        assert model_report["coordinator"]["clients"] == 2, model_report.get("coordinator")
        assert model_report["config"]["fleet_objective"] == "sum"  # auto: only the sum splits over the clients' shards
        own = set(record_keys(out / name / "records-cpu100"))
        assert own == {k for k in keys if k[0] in {w for w, _ in own}}


@pytest.mark.gpu
def test_a_fleet_on_a_gpu_tunes_each_model_at_its_own_share(pair, tmp_path):
    """Two models at 20% and 30% of the GPU under MPS: one search, each model's artifact built and timed at its share,
    its outputs within its precision's bound."""
    fleet = _write(tmp_path / "fleet.yaml", f"models:\n  - {{model: {pair[0]}, gpu_pct: 20}}\n"
                                            f"  - {{model: {pair[1]}, gpu_pct: 30}}\n")
    out = tmp_path / "out"
    proc = run_cli("tune", fleet, "--trials", "16", "--trials-per-iter", "4", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["report"]
    assert report["models_tuned"] == 2 and sorted(report["shares"]) == ["gpu20", "gpu30"]
    rows = {row["name"]: row for row in report["fleet"]}
    for name, share in (("a", "gpu20"), ("b", "gpu30")):
        model_report = json.load(open(out / name / "report.json"))
        assert model_report["share"] == share and model_report["numerics"]["tuned"][0]["cosine"] > 0.99
        assert model_report["config"]["fleet_objective"] == "geomean"  # auto, in one process
        assert os.path.getsize(rows[name]["artifact"]) > 0
