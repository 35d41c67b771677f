"""Warm start vs cold start (issue 14): estimated model latency against trials, for two tune runs.

Target: warm-started from a 100% run of the same model, tuning at 40% reaches the tuned latency of a
cold 40% run in <= 25% of that run's trials.

    tunekit tune r18.onnx --gpu-pct 40 --trials N --out COLD
    tunekit tune r18.onnx --gpu-pct 40 --trials N --warm-start SRC --out WARM     # SRC: a --gpu-pct 100 run
    python benchmarks/warm_start_curve.py --cold COLD --warm WARM [--share gpu40] \
        --results benchmarks/results/NAME/warm_start.md

Writes the markdown, plus warm_start.json (raw curves) and warm_start.png (if matplotlib imports)
beside it. The estimate after the first n trials (records in measurement order) is
    sum over tasks of weight x min(untuned_us, best us among the task's first n records),
the compiler's rule: a record is applied only if it beats the untuned kernel. Estimates leave out
everything between kernels (launch gaps, copies): compare them with the measured end-to-end latencies.
The warm run's first `candidates_measured_again` records are taken as its warm-start re-measurements
(they are measured before the search starts): true for a fresh out dir, not for one tuned with --resume.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # run from a checkout

from tunekit.records.database import mean_run_us  # noqa: E402
from tunekit.records.jsonl import read_records, read_workloads  # noqa: E402


def fail(message: str):
    raise SystemExit(f"warm_start_curve: {message}")


def machine() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30).stdout.strip()
        if out:
            return out.splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    with open("/proc/cpuinfo") as fh:
        model = next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), "unknown CPU")
    return f"{model}, {os.cpu_count()} cores"


def hex_key(db_hash) -> str:
    # The workload file holds TVM's structural hash in decimal; reports key tasks by the same hash as
    # 16 hex digits (tunekit.records.baselines.workload_key), so convert rather than hash the module again.
    return f"{int(db_hash) & 0xFFFFFFFFFFFFFFFF:016x}"


def load_run(out_dir: str, share: str | None) -> dict:
    """The report and the trials ((task key, us or None) in measurement order) of one tune out dir."""
    path = os.path.join(out_dir, "report.json")
    if not os.path.isfile(path):
        fail(f"{out_dir}: no report.json (not a finished `tunekit tune` out dir?)")
    with open(path) as fh:
        report = json.load(fh)
    mine = report.get("share")
    if not isinstance(mine, str):
        fail(f"{out_dir}: report.json is not a single-share report (share: {mine!r})")
    if share and share != mine:
        fail(f"{out_dir} was tuned at {mine}, not at --share {share}")
    db_dir = os.path.join(out_dir, f"records-{mine}")
    if not os.path.isdir(db_dir):
        fail(f"{out_dir}: no records-{mine}/ database")
    workloads = read_workloads(db_dir)
    trials = []
    for r in read_records(db_dir):
        line = workloads[r.workload] if r.workload < len(workloads) else None
        trials.append((hex_key(line[0]) if line else None, mean_run_us(r.run_secs)))
    return {"dir": out_dir, "share": mine, "report": report, "trials": trials}


def baselines(*runs) -> tuple[dict, list]:
    """task key -> (weight, untuned us), shared by both curves so they add up the same tasks. Both runs
    tune the same model at the same share: a baseline missing in one report is taken from the other."""
    tasks, unknown = {}, {}
    for run in runs:
        for t in run["report"].get("tasks", []):
            key = t.get("workload_hash") or t["name"]
            if t.get("untuned_us"):
                tasks.setdefault(key, (t.get("weight", 1), t["untuned_us"]))
            else:
                unknown[key] = t["name"]
    # Without a baseline a task has no value before its first record: the curve would jump *up* then.
    left_out = [(name, any(k == key for run in runs for k, _ in run["trials"]))
                for key, name in unknown.items() if key not in tasks]
    return tasks, left_out


def curve(run: dict, tasks: dict) -> list[float]:
    """Estimated latency (us) after n = 0..len(trials) trials."""
    best = {key: untuned for key, (_, untuned) in tasks.items()}
    total = sum(w * best[key] for key, (w, _) in tasks.items())
    points = [total]
    for key, us in run["trials"]:
        if key in best and us is not None and us < best[key]:
            total -= tasks[key][0] * (best[key] - us)
            best[key] = us
        points.append(total)
    return points


def first_at_or_below(points: list[float], goal: float) -> int | None:
    return next((n for n, v in enumerate(points) if v <= goal * (1 + 1e-9)), None)


def table_points(n_max: int, extra: list) -> list[int]:
    ns = {0, n_max, *(round(n_max * p / 10) for p in range(1, 10)), *(n for n in extra if n is not None)}
    n = 1
    while n < n_max:
        ns.add(n)
        n *= 2
    return sorted(x for x in ns if 0 <= x <= n_max)


def measured(report: dict) -> str:
    lat = report.get("latency_ms") or {}
    ms = [(lat.get(k) or {}).get("median_ms") for k in ("untuned", "tuned")]
    return " -> ".join(f"{v:.3f} ms" if v else "–" for v in ms)


def plot(path: str, cold: list, warm: list, warm_end: int, goal: float) -> str:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "(no plot: matplotlib does not import here)"
    fig, ax = plt.subplots(figsize=(7, 4))
    for points, label in ((cold, "cold"), (warm, "warm-started")):  # steps: the estimate holds between trials
        ax.plot(range(len(points)), [v / 1e3 for v in points], drawstyle="steps-post", label=label)
    ax.axhline(goal / 1e3, color="grey", linestyle=":", label="cold final estimate")
    if warm_end:
        ax.axvline(warm_end, color="grey", linestyle="--", label="end of warm-start re-measurements")
    ax.axvline((len(cold) - 1) * 0.25, color="red", linestyle=":", linewidth=0.8, label="25% of cold trials")
    ax.set(xlabel="trials", ylabel="estimated latency (ms)", title="Estimated model latency vs trials")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"![latency vs trials]({os.path.basename(path)})"


def table(c: list, w: list, warm_end: int, cross: int | None) -> list[str]:
    """Markdown rows at 0, 1, 2, 4, ..., every 10% of the longer run, its end, and the marked points."""
    rows = []
    for n in table_points(max(len(c), len(w)) - 1, [warm_end, cross]):
        cv, wv = (c[n] if n < len(c) else None), (w[n] if n < len(w) else None)
        notes = [text for text, hit in (("end of warm-start re-measurements", warm_end and n == warm_end),
                                        ("warm reaches cold final", n == cross)) if hit]
        cells = [f"{v / 1e3:.4f}" if v is not None else "–" for v in (cv, wv)]
        ratio = f"{wv / cv:.3f}" if cv and wv is not None else "–"
        rows.append(f"| {n} | {cells[0]} | {cells[1]} | {ratio} | {'; '.join(notes)} |")
    return rows


def summarize(cold: dict, warm: dict, tasks: dict) -> dict:
    c, w = curve(cold, tasks), curve(warm, tasks)
    n_cold, goal = len(c) - 1, c[-1]
    cross = first_at_or_below(w, goal)
    return {"share": cold["share"], "tasks": len(tasks), "cold_final_us": goal,
            "warm_reaches_cold_final_at": cross,
            "trials_on_unknown_workloads": sum(1 for run in (cold, warm) for k, _ in run["trials"] if k not in tasks),
            "fraction_of_cold_trials": cross / n_cold if cross is not None and n_cold else None,
            # a noise margin: the strict crossing can hinge on a fraction of a percent
            "warm_within_2pct_at": first_at_or_below(w, goal * 1.02),
            "warm_start_end": (warm["report"].get("warm_start") or {}).get("candidates_measured_again") or 0,
            "cold": {"dir": cold["dir"], "trials": n_cold, "curve_us": c},
            "warm": {"dir": warm["dir"], "trials": len(w) - 1, "curve_us": w}}


def render(s: dict, cold: dict, warm: dict, left_out: list, figure: str, json_name: str) -> list[str]:
    c, w, n_cold, n_warm = s["cold"]["curve_us"], s["warm"]["curve_us"], s["cold"]["trials"], s["warm"]["trials"]
    cross, frac, end = s["warm_reaches_cold_final_at"], s["fraction_of_cold_trials"], s["warm_start_end"]
    quarter = round(n_cold / 4)
    verdict = ("not reached" if cross is None else f"n = {cross} = {frac:.0%} of the cold run's {n_cold} trials: "
               + ("meets" if frac <= 0.25 else "misses") + " the <= 25% target")
    # The warm run's compiler used its own baselines; the curves share the cold ones (noise apart, the same).
    own = sum(t.get("weight", 1) * t["untuned_us"] for t in warm["report"]["tasks"] if t.get("untuned_us"))
    dropped = ", ".join(f"{name} ({'with' if has else 'no'} records)" for name, has in left_out) or "none"
    sources = ", ".join((warm["report"].get("warm_start") or {}).get("sources") or ["none"])
    return [
        "# Warm start vs cold start: estimated latency vs trials", "",
        f"- machine: {machine()}",
        f"- command: `python {' '.join(sys.argv)}`",
        f"- date: {datetime.datetime.now().isoformat(timespec='seconds')}",
        f"- cold: `{cold['dir']}` ({n_cold} trials)",
        f"- warm: `{warm['dir']}` ({n_warm} trials; the first {end} re-measure warm-start candidates from {sources})",
        f"- share {s['share']}; {s['tasks']} tasks in the estimate, with the cold report's untuned_us; left out "
        f"(no untuned_us in either report): {dropped}; trials on workloads not in the reports: "
        f"{s['trials_on_unknown_workloads']}", "",
        "## Result", "",
        f"- cold final estimate: {s['cold_final_us'] / 1e3:.4f} ms (untuned: {c[0] / 1e3:.4f} ms; with the warm "
        f"report's own untuned_us: {own / 1e3:.4f} ms)",
        f"- warm final estimate: {w[-1] / 1e3:.4f} ms",
        f"- warm curve first <= cold final: {verdict}; within 2% of it: "
        + ("not reached" if s["warm_within_2pct_at"] is None else f"n = {s['warm_within_2pct_at']}"),
        f"- warm estimate at 25% of the cold trials (n = {quarter}): "
        + (f"{w[quarter] / 1e3:.4f} ms" if quarter <= n_warm else "–"),
        f"- measured end to end (untuned -> tuned median): cold {measured(cold['report'])}, "
        f"warm {measured(warm['report'])}",
        "", "## Curves (estimated ms)", "", "| trials | cold | warm | warm/cold | |", "|---:|---:|---:|---:|---|",
        *table(c, w, end, cross), "", figure, "",
        f"Raw curves (us, n = 0..trials): `{json_name}`. Estimate: sum over tasks of weight x "
        "min(untuned, best record so far); launch gaps and copies are not in it.", ""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cold", required=True, help="out dir of the cold tune run")
    ap.add_argument("--warm", required=True, help="out dir of the warm-started tune run")
    ap.add_argument("--share", help="share label (gpu40, cpu50); default: the reports' own")
    ap.add_argument("--results", required=True, help="markdown to write (.json / .png go beside it)")
    args = ap.parse_args(argv)
    if not args.results.endswith(".md"):
        fail(f"--results must name a .md file, got {args.results}")
    cold, warm = load_run(args.cold, args.share), load_run(args.warm, args.share)
    if cold["share"] != warm["share"]:
        fail(f"the runs were tuned at different shares: {cold['share']} (cold) vs {warm['share']} (warm)")
    tasks, left_out = baselines(cold, warm)
    if not tasks:
        fail("no task has an untuned_us in either report (measure_untuned_tasks off?)")
    s = summarize(cold, warm, tasks)
    base = args.results[:-3]
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
    figure = plot(base + ".png", s["cold"]["curve_us"], s["warm"]["curve_us"], s["warm_start_end"], s["cold_final_us"])
    with open(base + ".json", "w") as fh:
        json.dump({**s, "left_out": left_out}, fh, indent=1)
    lines = render(s, cold, warm, left_out, figure, os.path.basename(base) + ".json")
    with open(args.results, "w") as fh:
        fh.write("\n".join(lines))
    print("\n".join(lines[lines.index("## Result") + 2:lines.index("## Curves (estimated ms)") - 1]))
    print(f"wrote {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
