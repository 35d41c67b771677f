"""Warm start and the saved cost model (issue 14), with real tuning runs on CPU shares."""
import json

import pytest

from tunekit.records.jsonl import read_records, read_workloads
from tunekit.testing import run_cli


def _timings(db_dir) -> dict:
    """(workload hash, trace) -> run_secs of every trial in a database."""
    workloads = read_workloads(str(db_dir))
    return {(workloads[r.workload][0], r.trace_text()): r.run_secs for r in read_records(str(db_dir))}


@pytest.fixture(scope="module")
def source(example_model, tmp_path_factory):
    out = tmp_path_factory.mktemp("warm") / "cpu100"
    proc = run_cli("tune", example_model, "--cpu-pct", "100", "--trials", "8", "--trials-per-iter", "4",
                   "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return out, json.loads(proc.stdout)["report"]


@pytest.mark.e2e
def test_warm_start_measures_foreign_records_again_and_never_copies_their_timings(example_model, source, tmp_path):
    src, _ = source
    proc = run_cli("tune", example_model, "--cpu-pct", "50", "--trials", "6", "--trials-per-iter", "2",
                   "--warm-start", src, "--out", tmp_path / "cpu50", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(proc.stdout)["report"]
    warm = report["warm_start"]
    assert warm["sources"] == [str(src)] and 1 <= warm["candidates_measured_again"] <= 4
    foreign, mine = _timings(src / "records-cpu100"), _timings(tmp_path / "cpu50" / "records-cpu50")
    assert len(mine) == report["trials"]["measured"] == 6  # the budget holds, warm-started trials included
    shared = set(foreign) & set(mine)
    assert len(shared) == warm["candidates_measured_again"]  # exactly the re-measured candidates came over
    assert all(mine[key] != foreign[key] for key in shared)  # with timings taken here, not copied
    assert report["cost_model"]["loaded_from"].endswith("records-cpu100/tunekit-cost-model.tar")


@pytest.mark.e2e
def test_the_saved_cost_model_is_reloaded_on_resume(example_model, source):
    src, first = source
    assert first["cost_model"]["saved_to"].endswith("tunekit-cost-model.tar")
    assert first["cost_model"]["loaded_from"] is None
    proc = run_cli("tune", example_model, "--cpu-pct", "100", "--trials", "4", "--trials-per-iter", "4",
                   "--out", src, "--resume", "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    model = json.loads(proc.stdout)["report"]["cost_model"]
    assert model["loaded_from"] == first["cost_model"]["saved_to"]
    assert model["samples_at_start"] >= first["trials"]["measured"] - first["trials"]["failed"]


def test_a_warm_start_dir_without_records_is_refused_in_one_line(example_model, tmp_path):
    proc = run_cli("tune", example_model, "--cpu-pct", "50", "--warm-start", tmp_path / "nothing", "--out",
                   tmp_path / "o")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert [line for line in proc.stderr.splitlines() if line.startswith("tunekit: error:")], proc.stderr
