"""No task kills a run: a task whose design space, search or builds keep failing keeps its untuned kernel, the rest
of the model is tuned, the artifact is written, and the report says why (clients.search_loop, clients.task_faults,
run.numerics_repair).
Real model, real engine, in one process, through Ray clients, and with several shares."""
import json
import os

import pytest

from tunekit.clients.task_faults import ENV
from tunekit.testing import run_cli

pytestmark = pytest.mark.e2e

CONV0, CONV1 = "fused_conv2d_add_relu", "fused_conv2d1_add1_relu1"  # tiny_cnn's two convs


def _tune(model, out, monkeypatch, faults: str, *flags) -> tuple[dict, str]:
    monkeypatch.setenv(ENV, faults)
    share = [] if any(f.startswith("--cpu-pct") for f in flags) else ["--cpu-pct", "100"]
    proc = run_cli("tune", model, *share, "--trials", "12", "--trials-per-iter", "2", *flags, "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout), proc.stderr


def _rows(report: dict) -> dict:
    return {task["name"]: task for task in report["tasks"]}


def _warned(stderr: str, count: int) -> None:
    lines = [line for line in stderr.splitlines() if "kept their untuned kernel" in line]
    assert len(lines) >= 1 and lines[0].startswith(f"tunekit: warning: {count} task(s)"), stderr[-2000:]


def test_a_task_without_a_design_space_and_one_whose_builds_all_fail_keep_their_untuned_kernels(
        example_model, tmp_path, monkeypatch):
    result, stderr = _tune(example_model, tmp_path / "run", monkeypatch, f"design_space:{CONV1},build:{CONV0}")
    report = result["report"]
    rows = _rows(report)
    assert rows[CONV1]["fallback"].startswith("design space: injected design_space failure"), rows[CONV1]
    assert rows[CONV1]["trials"] == 0 and rows[CONV1]["searches"] == 0
    # three batches of 2, every candidate failed to build: it stops there, and the rest of the budget goes elsewhere
    assert rows[CONV0]["fallback"].startswith("build: its first 6 candidates all failed: injected build failure")
    assert rows[CONV0]["trials"] == rows[CONV0]["failed_build"] == 6 and rows[CONV0]["tuned_us"] is None
    assert report["fallback_tasks"] == 2 and report["trials"]["measured"] <= 12
    assert all("fallback" not in row for name, row in rows.items() if name not in (CONV0, CONV1))
    assert os.path.getsize(result["artifact"]) > 0  # the model was compiled, with both convs untuned
    _warned(stderr, 2)


def test_a_task_whose_search_fails_is_dropped_by_a_ray_client_and_the_others_are_tuned(
        example_model, tmp_path, monkeypatch):
    result, stderr = _tune(example_model, tmp_path / "ray", monkeypatch, f"search:{CONV0}", "--clients", "2")
    report = result["report"]
    rows = _rows(report)
    assert rows[CONV0]["fallback"].startswith("search: injected search failure"), rows[CONV0]
    assert rows[CONV0]["trials"] == 0
    assert rows[CONV1]["trials"] > 0 and rows[CONV1]["tuned_us"] is not None  # the other conv was tuned
    assert report["trials"]["measured"] == 12  # its trials went to the other tasks (through the pool)
    _warned(stderr, 1)


def test_with_several_shares_every_share_reports_the_tasks_that_fell_back(example_model, tmp_path, monkeypatch):
    """Also a tuned kernel that breaks the outputs: the tuned build is refused by the numerics gate (the untuned one
    passed), the run finds the records to blame (run.numerics_repair) and ships the rest tuned, at each share."""
    result, stderr = _tune(example_model, tmp_path / "shares", monkeypatch,
                           f"design_space:{CONV1},wrong_kernel:{CONV0}", "--cpu-pct", "50,100")
    for label, report in result["report"]["per_share"].items():
        rows = _rows(report)
        assert rows[CONV1]["fallback"].startswith("design space: injected"), (label, rows[CONV1])
        assert rows[CONV1]["trials"] == 0 and rows[CONV0]["trials"] > 0, label
        assert rows[CONV0]["fallback"].startswith("its tuned kernel broke the model: the tuned model is refused"), \
            (label, rows[CONV0])
        assert rows[CONV0]["record_applied"] is False, label
        assert report["fallback_tasks"] == 2 and report["numerics"]["tuned"][0]["cosine"] > 0.9999, label
    _warned(stderr, 2)


def test_a_tuned_kernel_that_crashes_the_model_keeps_its_task_untuned(example_model, tmp_path, monkeypatch):
    """The tuned build crashes the latency worker that times it (SIGSEGV): the crashing record is found
    (run.numerics_repair) and left out, its task keeps the untuned kernel, the other conv stays tuned; the row names
    the signal and TVM's crash banner, not the last frame of the backtrace that follows it."""
    result, stderr = _tune(example_model, tmp_path / "crash", monkeypatch, f"crash_kernel:{CONV0}")
    report = result["report"]
    rows = _rows(report)
    assert rows[CONV0]["fallback"].startswith("its tuned kernel broke the model: latency measurement at cpu100 "
                                              "failed: the worker died (SIGSEGV): Segfault encountered"), rows[CONV0]
    assert rows[CONV0]["record_applied"] is False and rows[CONV1]["record_applied"] is True, rows
    assert report["fallback_tasks"] == 1 and report["numerics"]["tuned"][0]["cosine"] > 0.9999
    _warned(stderr, 1)
