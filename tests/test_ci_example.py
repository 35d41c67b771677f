"""examples/ci_tune.py as a CI job runs it: a cache restored between runs, an SLO gate, a summary."""
import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e

SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "ci_tune.py")


def _ci(example_model, cwd, *args):
    return subprocess.run([sys.executable, SCRIPT, example_model, "--cpu-pct", "50", "--cache", "cache",
                           "--trials", "4", "--summary", "summary.json", "--artifacts", "build", *map(str, args)],
                          capture_output=True, text=True, timeout=900, cwd=cwd)


def test_ci_job_resumes_from_its_cache_and_gates_on_the_slo(example_model, tmp_path):
    first = _ci(example_model, tmp_path, "--slo-ms", "1000")
    assert first.returncode == 0, first.stderr[-2000:]
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["slo_met"] and not summary["resumed_from_cache"] and summary["trials_total"] == 4
    assert os.path.isfile(tmp_path / "build" / "tiny_cnn-cpu50.so")
    assert os.path.isfile(tmp_path / "build" / "tiny_cnn-cpu50.json")  # the artifact's metadata
    assert os.path.isdir(tmp_path / "cache" / "records-cpu50")
    # the next CI run continues the cached records, and an SLO no model meets fails the job (exit 3)
    second = _ci(example_model, tmp_path, "--slo-ms", "0.000001")
    assert second.returncode == 3, second.stderr[-2000:]
    summary = json.load(open(tmp_path / "summary.json"))
    assert summary["resumed_from_cache"] and summary["trials_this_run"] == 4 and summary["trials_total"] == 8
    assert summary["slo_met"] is False and summary["tuned_ms"] > 0
