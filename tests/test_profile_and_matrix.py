"""profile (knee of the untuned latency curve), tune --cpu-pct auto, and evaluate's matrix outputs.
Real TVM builds, real pinned latency workers, the real `tunekit` command."""
import json
import os
import re

import pytest

from tunekit.testing import run_cli


def _check_knee(profile: dict) -> None:
    rows = sorted(profile["shares"], key=lambda r: r["pct"])
    limit = (1 + profile["tolerance"]) * rows[-1]["median_ms"]
    qualifying = [r["share"] for r in rows if r["median_ms"] <= limit]
    assert profile["knee"] == qualifying[0], (profile["knee"], rows)  # the smallest share that qualifies


@pytest.mark.e2e
def test_profile_cli_finds_knee_and_writes_files(example_model, tmp_path):
    out = tmp_path / "prof"
    proc = run_cli("profile", example_model, "--cpu-pct", "50,100", "--repeats", "10", "--json", "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    profile = json.loads(proc.stdout)
    assert [r["share"] for r in profile["shares"]] == ["cpu50", "cpu100"]
    assert all(r["median_ms"] > 0 and r["std_ms"] >= 0 and r["cores"] >= 1 for r in profile["shares"])
    assert profile["shares"][-1]["cores"] == len(os.sched_getaffinity(0))
    assert profile["tolerance"] == pytest.approx(0.1)
    _check_knee(profile)
    assert json.load(open(out / "profile.json")) == profile
    assert (out / "profile.png").stat().st_size > 0


def test_profile_rejects_bad_tolerance_in_one_line(example_model):
    proc = run_cli("profile", example_model, "--cpu-pct", "50,100", "--tolerance", "-1")
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "--tolerance" in proc.stderr


def test_find_knee_definition():
    from tunekit.profiling import find_knee

    rows = [{"share": f"cpu{p}", "median_ms": ms} for p, ms in ((25, 10.0), (50, 5.4), (75, 5.2), (100, 5.0))]
    assert find_knee(rows, tolerance=0.1) == "cpu50"
    assert find_knee(rows, tolerance=0.01) == "cpu100"
    assert find_knee(rows, tolerance=1.0) == "cpu25"


@pytest.fixture(scope="module")
def two_tuned_records(example_model, tmp_path_factory):
    """Records tuned at cpu50 and at cpu100 (separate runs; cpu100's with the numerics gate loosened),
    gathered into one dir."""
    root = tmp_path_factory.mktemp("matrix")
    gathered = root / "records"
    gathered.mkdir()
    (root / "loose.yaml").write_text("max_output_error: 0.5\nmin_output_cosine: 0.99\n")
    for pct in (50, 100):
        out = root / f"cpu{pct}"
        config = ["--config", root / "loose.yaml"] if pct == 100 else []
        proc = run_cli("tune", example_model, "--cpu-pct", pct, "--trials", "8", "--out", out, "--json", *config)
        assert proc.returncode == 0, proc.stderr[-3000:]
        os.symlink(out / f"records-cpu{pct}", gathered / f"records-cpu{pct}")
    return gathered


@pytest.mark.e2e
def test_evaluate_matrix_outputs(example_model, two_tuned_records, tmp_path):
    out = tmp_path / "eval"
    proc = run_cli("evaluate", example_model, "--records", two_tuned_records, "--cpu-pct", "50,100",
                   "--repeats", "5", "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(proc.stdout)["results"]
    assert sorted((r["tuned_at"], r["run_at"]) for r in rows) == sorted(
        (t, r) for t in ("cpu50", "cpu100") for r in ("cpu50", "cpu100"))
    assert all(r["median_ms"] > 0 and r["numerics_ok"] for r in rows)
    # each artifact is judged by the bound its run's gate applied: the precision's, with that run's overrides
    bounds = {r["tuned_at"]: r["numerics_bound"] for r in rows}
    assert bounds["cpu50"] == {"max_rel_err": 1e-3, "min_cosine": 0.99999}
    assert bounds["cpu100"] == {"max_rel_err": 0.5, "min_cosine": 0.99}

    matrix = json.load(open(out / "matrix.json"))
    assert matrix["results"] == rows
    for run_at in ("cpu50", "cpu100"):
        column = [r for r in rows if r["run_at"] == run_at]
        assert matrix["best_per_run_at"][run_at] == min(column, key=lambda r: r["median_ms"])["tuned_at"]

    md = (out / "matrix.md").read_text()
    for label in ("cpu50", "cpu100"):
        assert label in md
    table = [line for line in md.splitlines() if line.startswith("| cpu")]
    assert len(table) == 2  # one line per tuned_at
    cells = [[c.strip() for c in line.strip("|").split("|")[1:]] for line in table]
    for col in range(2):  # exactly one bold cell per run_at column, and it is the best row
        bold = [i for i, row in enumerate(cells) if row[col].startswith("**")]
        assert len(bold) == 1, md
    assert all(re.search(r"\d ± \d", c) for row in cells for c in row)

    assert (out / "latency_vs_share.png").stat().st_size > 0
    html = (out / "report.html").read_text()
    assert 'src="latency_vs_share.png"' in html and "<table>" in html


@pytest.mark.e2e
def test_tune_auto_tunes_at_the_knee(example_model, tmp_path):
    out = tmp_path / "auto"
    proc = run_cli("tune", example_model, "--cpu-pct", "auto", "--trials", "8", "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)["report"]
    choice = report["share_choice"]
    assert choice["mode"] == "auto"
    assert choice["chosen"] == report["share"] == choice["profile"]["knee"]
    assert [r["share"] for r in choice["profile"]["shares"]] == ["cpu25", "cpu50", "cpu75", "cpu100"]
    _check_knee(choice["profile"])
    assert json.load(open(out / "report.json"))["share_choice"] == choice
