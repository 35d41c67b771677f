"""Latency SLO mode (`tune --slo-ms`): the walk over shares (fast, with stand-in profile and tune
callables passed to tunekit.slo.tune_for_slo) and end to end on the example model (real profile,
real tuning, the real `tunekit` command)."""
import json
import os
import re

import pytest

from tunekit.results import ProfileResult, TuneResult
from tunekit.testing import run_cli


# ---------- the walk, with stand-ins for profile() and tune() ----------

class FakeTuning:
    """profile -> untuned latency per share from `untuned`; tune -> a report.json with `tuned[share]`."""

    def __init__(self, untuned: dict, tuned: dict):
        self.untuned, self.tuned, self.calls = untuned, tuned, []

    def profile(self, model, *, cpu_pct=None, gpu_pct=None, **kw):
        pcts = [int(p) for p in str(cpu_pct).split(",")]
        rows = [{"share": f"cpu{p}", "pct": p, "median_ms": self.untuned[f"cpu{p}"], "std_ms": 0.0} for p in pcts]
        return ProfileResult(model=model, kind="cpu", tolerance=0.1, repeats=kw.get("repeats", 20), shares=rows,
                             knee=f"cpu{pcts[-1]}")

    def tune(self, model, *, cpu_pct=None, gpu_pct=None, out=None, config=None, **kw):
        label = f"cpu{cpu_pct}"
        self.calls.append(label)
        os.makedirs(out, exist_ok=True)
        report = {"share": label, "share_choice": {"mode": "fixed", "chosen": label},
                  "latency_ms": {"tuned": {"median_ms": self.tuned[label]}}}
        path = os.path.join(out, "report.json")
        with open(path, "w") as fh:
            json.dump(report, fh)
        return TuneResult(share=label, out_dir=out, records_dir=os.path.join(out, f"records-{label}"),
                          artifact="x.so", report_path=path, untuned_ms=self.untuned[label],
                          tuned_ms=self.tuned[label], trials=config.trials, wall_s=1.0, report=report)

    def walk(self, **kwargs):
        from tunekit.slo import tune_for_slo

        return tune_for_slo("m.onnx", tune=self.tune, profile=self.profile, **kwargs)


def test_walk_stops_at_the_smallest_share_that_meets(tmp_path):
    fake = FakeTuning(untuned={"cpu25": 9.0, "cpu50": 6.0, "cpu75": 5.0, "cpu100": 4.0},
                      tuned={"cpu25": 3.0, "cpu50": 1.9, "cpu75": 1.5, "cpu100": 1.0})
    result = fake.walk(slo_ms=2.0, cpu_pct="100,25,50,75", trials=4, out=str(tmp_path / "o"))
    assert fake.calls == ["cpu25", "cpu50"]  # smallest first, stops at the first that meets
    assert (result.met, result.chosen, result.tuned_ms) == (True, "cpu50", 1.9)
    assert [c["status"] for c in result.candidates] == ["not_met", "met", "not_needed", "not_needed"]
    assert [r["share"] for r in result.tried] == ["cpu25", "cpu50"]
    assert [r["trials"] for r in result.tried] == [4, 4]  # `trials` is each tuned share's budget
    saved = json.load(open(tmp_path / "o" / "slo.json"))
    assert saved["share_choice"]["met"] is True and saved["chosen"] == "cpu50"
    for share in ("cpu25", "cpu50"):  # every tuned share's report records the whole walk
        report = json.load(open(tmp_path / "o" / share / "report.json"))
        assert report["share_choice"] == saved["share_choice"]
        assert report["share_choice"]["mode"] == "slo" and report["share_choice"]["slo_ms"] == 2.0


def test_walk_not_met_tries_all_and_names_the_best(tmp_path):
    from tunekit.slo import describe

    fake = FakeTuning(untuned={"cpu50": 6.0, "cpu100": 4.0}, tuned={"cpu50": 2.5, "cpu100": 2.25})
    result = fake.walk(slo_ms=1.0, cpu_pct="50,100", out=str(tmp_path / "o"))
    assert fake.calls == ["cpu50", "cpu100"]
    assert (result.met, result.chosen, result.best_share, result.best_ms) == (False, None, "cpu100", 2.25)
    assert "SLO NOT met (best: 2.2500 ms at cpu100)" in describe(result)


def test_max_speedup_skips_hopeless_shares(tmp_path):
    fake = FakeTuning(untuned={"cpu25": 30.0, "cpu50": 8.0, "cpu100": 4.0},
                      tuned={"cpu25": 9.0, "cpu50": 1.5, "cpu100": 1.0})
    result = fake.walk(slo_ms=2.0, cpu_pct="25,50,100", max_speedup=5, out=str(tmp_path / "o"))
    assert fake.calls == ["cpu50"]  # cpu25 would need 15x > 5x
    assert [c["status"] for c in result.candidates] == ["skipped", "met", "not_needed"]
    assert "15x" not in result.candidates[0]["reason"] and "5x" in result.candidates[0]["reason"]


@pytest.mark.parametrize("value", [0, -1, "abc", float("nan"), float("inf"), True, None])
def test_check_slo_ms_rejects(value):
    from tunekit.errors import TunekitError
    from tunekit.slo import check_slo_ms

    with pytest.raises(TunekitError, match="--slo-ms must be a positive number"):
        check_slo_ms(value)
    assert check_slo_ms("2.5") == 2.5


def test_candidate_shares_default_sorted_and_no_auto():
    from tunekit.errors import TunekitError
    from tunekit.slo import candidate_shares

    assert [s.label for s in candidate_shares(gpu_pct=None, cpu_pct=None)] == ["cpu25", "cpu50", "cpu75", "cpu100"]
    assert [s.label for s in candidate_shares(gpu_pct=None, cpu_pct="100,50,50")] == ["cpu50", "cpu100"]
    with pytest.raises(TunekitError, match="not 'auto'"):
        candidate_shares(gpu_pct=None, cpu_pct="auto")


@pytest.mark.parametrize("args, needle", [
    (["--slo-ms", "0"], "--slo-ms must be a positive number"),
    (["--slo-ms=-3"], "--slo-ms must be a positive number"),
    (["--slo-ms", "fast"], "--slo-ms must be a positive number"),
    (["--slo-ms", "5", "--cpu-pct", "auto"], "not 'auto'"),
    (["--slo-ms", "5", "--cpu-pct", "50,x"], "not an integer percentage"),
    (["--slo-ms", "5", "--cpu-pct", "50", "--slo-max-speedup", "0.5"], "max_speedup must be a number >= 1"),
    (["--slo-max-speedup", "3"], "--slo-max-speedup needs --slo-ms"),
])
def test_cli_slo_errors_are_one_line(example_model, tmp_path, args, needle):
    out = tmp_path / "o"
    proc = run_cli("tune", example_model, *args, "--out", out)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip().count("\n") == 0 and needle in proc.stderr, proc.stderr
    assert not out.exists()  # refused before any work


def test_help_documents_the_exit_code():
    proc = run_cli("tune", "--help")
    assert "--slo-ms" in proc.stdout and "3 when no candidate share meets it" in " ".join(proc.stdout.split())


# ---------- end to end: real profile, real tuning (tiny budgets) ----------

def _report_tuned_ms(path) -> float:
    return json.load(open(path))["latency_ms"]["tuned"]["median_ms"]


@pytest.mark.e2e
def test_generous_slo_picks_the_smallest_share(example_model, tmp_path):
    from tunekit.profiling import profile
    from tunekit.records.database import count_trials

    untuned = profile(example_model, cpu_pct="50,100", repeats=10)
    slo = 3 * untuned.row("cpu50")["median_ms"]  # well above even the untuned latency at the smallest share
    out = tmp_path / "slo"
    proc = run_cli("tune", example_model, "--slo-ms", slo, "--cpu-pct", "50,100", "--trials", "8",
                   "--out", out, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout)
    assert (result["met"], result["chosen"], result["kind"]) == (True, "cpu50", "cpu")
    assert [r["share"] for r in result["tried"]] == ["cpu50"]  # cpu100 never tuned
    assert [c["status"] for c in result["candidates"]] == ["met", "not_needed"]
    assert not (out / "cpu100").exists()

    report = json.load(open(out / "cpu50" / "report.json"))
    assert report["share"] == "cpu50"
    assert result["tuned_ms"] == report["latency_ms"]["tuned"]["median_ms"] == result["tried"][0]["tuned_ms"]
    assert result["tried"][0]["untuned_ms"] == report["latency_ms"]["untuned"]["median_ms"]
    assert 0 < result["tuned_ms"] <= slo
    assert report["trials"]["measured"] == result["tried"][0]["trials"] >= 8
    assert count_trials(str(out / "cpu50" / "records-cpu50")) >= report["trials"]["measured"]
    saved = json.load(open(out / "slo.json"))
    assert report["share_choice"] == saved["share_choice"]
    assert saved["share_choice"]["slo_ms"] == pytest.approx(slo) and saved["share_choice"]["met"] is True
    assert [r["share"] for r in saved["profile"]["shares"]] == ["cpu50", "cpu100"]


@pytest.mark.e2e
def test_impossible_slo_tries_every_share_and_exits_3(example_model, tmp_path):
    out = tmp_path / "slo"
    proc = run_cli("tune", example_model, "--slo-ms", "1e-6", "--cpu-pct", "50,100", "--trials", "4", "--out", out)
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-3000:])
    assert "XGB iter" not in proc.stderr  # MetaSchedule's logger is quieted again for every share after the first
    saved = json.load(open(out / "slo.json"))
    assert saved["met"] is False and saved["chosen"] is None
    assert [r["share"] for r in saved["tried"]] == ["cpu50", "cpu100"]
    assert [c["status"] for c in saved["candidates"]] == ["not_met", "not_met"]
    tuned = {r["share"]: _report_tuned_ms(out / r["share"] / "report.json") for r in saved["tried"]}
    assert {r["share"]: r["tuned_ms"] for r in saved["tried"]} == tuned
    best = min(tuned, key=tuned.get)
    assert (saved["best_share"], saved["best_ms"]) == (best, tuned[best])
    for share in tuned:
        choice = json.load(open(out / share / "report.json"))["share_choice"]
        assert choice["mode"] == "slo" and choice["met"] is False and choice["slo_ms"] == 1e-6
        assert [r["share"] for r in choice["tried"]] == ["cpu50", "cpu100"]
    match = re.search(r"SLO NOT met \(best: ([\d.]+) ms at (cpu\d+)\)", proc.stdout)
    assert match, proc.stdout
    assert match.group(2) == best and float(match.group(1)) == pytest.approx(tuned[best], abs=1e-4)
