"""Issue 15's study, the evaluation half: every artifact of one build-once run, measured at every share.

After `tunekit tune M.onnx --gpu-pct 20,40,100 --robust --out W` (study_session.sh `study` runs both),

  python benchmarks/share_study.py matrix --work W --kind gpu --pcts 20,40,60,100

measures `<model>-gpu<S>.so` (tuned at S) and `<model>-robust.so` at each share with `tunekit.bench`,
back to back in one process, and writes W/study_matrix.{json,md}: p50 latency per tuned-at x run-at,
the regret of each (latency / the best latency at that run-at share), and tuned-at-S against
tuned-at-100 at S. Per-task launch shapes (blocks x threads against the share's SMs) are in W/report.json
(`tasks_best_us[].launch`, written by the tune). `--kind cpu` does the same for CPU shares.

  python benchmarks/share_study.py tasks --work W [--reference gpu100]

reads every share's records (each candidate was measured at every share) and writes W/study_tasks.{json,md}:
per task, the best kernel at each share, what the kernel that was best at the reference share takes at each
share (the cost of tuning at the wrong share, per task), and the launch shape of each share's best.

  python benchmarks/share_study.py records --work W [--ratio 1.2]

what the records themselves say. (1) Contradictions: a kernel whose launch does not change cannot get
slower with more SMs, so a candidate recorded more than RATIO slower at a larger share is a measurement
error; their rate, by tenth of the run (record order) and
by kernel size. (2) The share-robust choice from the kernels' weighted sums: the whole-model choice
tunekit makes (records.robust.model_robust_choice), the dual's lower bound on any choice from these
candidates, each share's own choice and each task's own minimax choice. Writes W/study_records.{json,md}.

  python benchmarks/share_study.py plot W1/study_matrix.json [W2/study_matrix.json ...] --out latency_vs_share.png

a panel per model: p50 latency against the run-at share, a line per artifact, its worst regret in the legend.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def artifacts(work: str, kind: str) -> dict[str, str]:
    """{"tuned at <share>" or "robust": path} of a tune out dir."""
    found = {}
    for path in sorted(glob.glob(os.path.join(work, "*.so"))):
        name = os.path.basename(path)
        match = re.search(rf"-({kind}\d+)\.so$", name)
        if match and not name.startswith("untuned"):
            found[match.group(1)] = path
        elif name.endswith("-robust.so"):
            found["robust"] = path
        elif name.endswith("-robust-per-task.so"):  # the per-task choice, when the whole-model one differs
            found["robust-per-task"] = path
    return found


def measure(found: dict[str, str], kind: str, pcts: list[int], repeats: int) -> tuple[dict, dict]:
    """({artifact: {pct: p50 ms}}, {artifact: {pct: the variant it ran}} for the share-robust artifact)."""
    from tunekit.deploy import bench

    matrix: dict[str, dict[int, float]] = {}
    variants: dict[str, dict[int, str]] = {}
    for pct in pcts:  # one share at a time, every artifact back to back: the same conditions for each
        for label, path in found.items():
            result = bench(path, repeats=repeats, **{f"{kind}_pct": pct})
            matrix.setdefault(label, {})[pct] = round(result.p50_ms, 4)
            ran = f" (ran its {result.variant} variant)" if result.variant else ""
            if result.variant:
                variants.setdefault(label, {})[pct] = result.variant
            print(f"{label} at {kind}{pct}: {result.p50_ms:.4f} ms{ran}", flush=True)
    return matrix, variants


def summarize(matrix: dict[str, dict[int, float]], kind: str, pcts: list[int]) -> dict:
    best = {p: min(row[p] for row in matrix.values()) for p in pcts}
    regret = {label: {p: round(row[p] / best[p], 4) for p in pcts} for label, row in matrix.items()}
    full = f"{kind}100"
    at_share = {p: round(matrix[f"{kind}{p}"][p] / matrix[full][p], 4)
                for p in pcts if f"{kind}{p}" in matrix and full in matrix}
    return {"p50_ms": matrix, "regret": regret, "worst_regret": {k: max(v.values()) for k, v in regret.items()},
            "tuned_at_share_over_tuned_at_100": at_share}


def _write_both(work: str, stem: str, data, text: str) -> str:
    """W/<stem>.json and W/<stem>.md; returns the markdown."""
    with open(os.path.join(work, f"{stem}.json"), "w") as fh:
        json.dump(data, fh, indent=1)
    with open(os.path.join(work, f"{stem}.md"), "w") as fh:
        fh.write(text)
    return text


def write(work: str, study: dict, kind: str, pcts: list[int]) -> str:
    head = "| tuned at | " + " | ".join(f"run at {kind}{p}" for p in pcts) + " | worst regret |"
    lines = ["p50 latency in ms (regret: latency / the best at that share)", "", head,
             "| --- |" + " ---: |" * (len(pcts) + 1)]
    for label, row in study["p50_ms"].items():
        cells = [f"{row[p]} ({study['regret'][label][p]})" for p in pcts]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {study['worst_regret'][label]} |")
    lines += ["", "Tuned at the share / tuned at 100%, run at the share: "
              + ", ".join(f"{kind}{p}: {v}" for p, v in study["tuned_at_share_over_tuned_at_100"].items())]
    for label, ran in study.get("variant_ran", {}).items():
        lines.append(f"{label} ran the variant tuned at: " + ", ".join(f"{v} at {kind}{p}" for p, v in ran.items()))
    return _write_both(work, "study_matrix", study, "\n".join(lines) + "\n")


def candidate_times(work: str, kind: str) -> dict[str, dict[str, dict[str, float]]]:
    """{share: {workload key: {trace: mean us}}} from every records-<share> dir of a tune out dir."""
    from tunekit.records.jsonl import read_records, read_workloads

    out: dict = {}
    for db_dir in sorted(glob.glob(os.path.join(work, f"records-{kind}*"))):
        share = os.path.basename(db_dir)[len("records-"):]
        # The key the report uses (records.baselines.workload_key): the structural hash, as 16 hex digits.
        keys = [f"{int(w[0]) & 0xFFFFFFFFFFFFFFFF:016x}" if w else None for w in read_workloads(db_dir)]
        table = out.setdefault(share, {})
        for line in read_records(db_dir):
            secs = [float(x) for x in line.run_secs if x is not None and float(x) < 1e9]
            if secs and line.workload < len(keys) and keys[line.workload]:
                table.setdefault(keys[line.workload], {})[line.trace_text()] = 1e6 * sum(secs) / len(secs)
    return out


def record_order(db_dir: str) -> list[tuple[str, str]]:
    """(workload key, trace) of each record of one share, in the order the run measured them."""
    from tunekit.records.jsonl import read_records, read_workloads

    keys = [f"{int(w[0]) & 0xFFFFFFFFFFFFFFFF:016x}" if w else None for w in read_workloads(db_dir)]
    return [(keys[line.workload], line.trace_text()) for line in read_records(db_dir)
            if line.workload < len(keys) and keys[line.workload]]


def records_summary(work: str, kind: str, ratio: float) -> dict:
    """Contradictions of the shares' SM order, and the share-robust choice, from the records alone."""
    from tunekit.records.baselines import read_baselines
    from tunekit.records.robust import model_robust_choice, robust_choice

    times = candidate_times(work, kind)
    shares = sorted(times, key=lambda s: int(s[len(kind):]))
    every = {(wk, tr): {s: times[s][wk][tr] for s in shares}
             for wk, traces in times[shares[0]].items() for tr in traces
             if all(tr in times[s].get(wk, {}) for s in shares)}
    order = [key for key in record_order(os.path.join(work, f"records-{shares[0]}")) if key in every]

    # a kernel whose launch does not change cannot get slower with more SMs
    def worst_ratio(row):  # time at a larger share over time at a smaller one: > 1 contradicts
        return max(row[hi] / row[lo] for i, lo in enumerate(shares) for hi in shares[i + 1:])

    bad = [worst_ratio(every[key]) > ratio for key in order]
    tenths = [sum(bad[i] for i in range(len(order)) if i * 10 // len(order) == t) for t in range(10)]
    small = [b for key, b in zip(order, bad) if min(every[key].values()) < 10]
    large = [b for key, b in zip(order, bad) if min(every[key].values()) >= 10]
    contradictions = {"ratio": ratio, "candidates": len(order), "contradicting": sum(bad),
                      "by_tenth_of_the_run": tenths,
                      "under_10us": [sum(small), len(small)], "from_10us": [sum(large), len(large)]}

    weights, tasks = {}, {}
    for share in shares:
        path = os.path.join(work, f"report-{share}.json")
        if os.path.isfile(path):
            weights.update({t["workload_hash"]: t.get("weight", 1)
                            for t in json.load(open(path)).get("tasks", []) if t.get("workload_hash")})
    baselines = {s: read_baselines(os.path.join(work, f"records-{s}")) for s in shares}
    for (wk, tr), row in every.items():
        tasks.setdefault(wk, {})[tr] = row
    for wk in tasks:
        if all(baselines[s].get(wk) for s in shares):
            tasks[wk]["untuned"] = {s: baselines[s][wk] for s in shares}
    model = model_robust_choice(tasks, weights, shares)

    def regret_of(choice):
        return {s: round(sum(weights.get(t, 1) * tasks[t][c][s] for t, c in choice.items())
                         / model.best_sum[s], 4) for s in shares}

    choices = {"whole-model choice (tunekit --robust)": model.choice}
    for own in shares:
        choices[f"each task's best at {own}"] = {t: min(c, key=lambda k: c[k][own]) for t, c in tasks.items()}
    per_task = {}  # the rule before: per task, among each share's best and the untuned kernel
    for t, c in tasks.items():
        pool = {min(c, key=lambda k: c[k][s]) for s in shares} | ({"untuned"} & set(c))
        per_task[t] = robust_choice({k: c[k] for k in pool}, shares).candidate
    choices["each task's own minimax (the rule before)"] = per_task
    robust = {}
    for name, choice in choices.items():
        regret = regret_of(choice)
        robust[name] = {"regret": regret, "worst_regret": max(regret.values())}
    return {"shares": shares, "contradictions": contradictions, "robust": robust,
            "lower_bound": round(model.lower_bound, 4),
            "best_kernel_sum_us": {s: round(b, 2) for s, b in model.best_sum.items()}}


def write_records(work: str, summary: dict) -> str:
    c, shares = summary["contradictions"], summary["shares"]
    pct = lambda n, d: f"{n} of {d} ({100 * n / d:.1f}%)" if d else "0"  # noqa: E731
    lines = [f"Candidates recorded more than {c['ratio']}x slower at a larger share: "
             f"{pct(c['contradicting'], c['candidates'])}; by tenth of the run: {c['by_tenth_of_the_run']}; "
             f"kernels under 10 us: {pct(*c['under_10us'])}, from 10 us: {pct(*c['from_10us'])}.", "",
             "Share-robust choice, estimated from the kernels' weighted sums (regret: the sum over the sum of "
             "each task's best at the share):", "",
             "| choice | " + " | ".join(shares) + " | worst |", "| --- |" + " ---: |" * (len(shares) + 1)]
    for name, row in summary["robust"].items():
        lines.append(f"| {name} | " + " | ".join(f"{row['regret'][s]:.4f}" for s in shares)
                     + f" | {row['worst_regret']:.4f} |")
    lines += ["", f"No choice from these candidates has a worst regret below {summary['lower_bound']:.4f} "
              "(the Lagrangian dual's bound)."]
    return _write_both(work, "study_records", summary, "\n".join(lines) + "\n")


def per_task(times: dict, report: dict, shares: list[str], reference: str) -> list[dict]:
    """Per task: best us at each share, and the reference share's best kernel timed at each share."""
    names = {}
    for row in report.get("tasks", []):
        names[row["workload_hash"]] = row
    launches = {t["name"]: t.get("launch", {}) for t in report.get("tasks_best_us", [])}
    rows = []
    for wk in sorted({wk for table in times.values() for wk in table}):
        common = set.intersection(*(set(times[s].get(wk, {})) for s in shares))
        if not common:
            continue
        best = {s: min(common, key=lambda tk: times[s][wk][tk]) for s in shares}
        info = names.get(wk, {})
        row = {"task": info.get("name", wk), "weight": info.get("weight", 1), "candidates": len(common),
               "best_us": {s: round(times[s][wk][best[s]], 3) for s in shares},
               "reference_best_us": {s: round(times[s][wk][best[reference]], 3) for s in shares},
               "same_kernel_as_reference": {s: best[s] == best[reference] for s in shares},
               "launch": launches.get(info.get("name"), {})}
        row["reference_over_best"] = {s: round(row["reference_best_us"][s] / row["best_us"][s], 4) for s in shares}
        rows.append(row)
    return sorted(rows, key=lambda r: -r["weight"] * max(r["best_us"].values()))


def write_tasks(work: str, rows: list[dict], shares: list[str], reference: str) -> str:
    def launch(row, s):
        shape = row["launch"].get(s) or {}
        return f"{shape['blocks']}x{shape['threads']} ({shape.get('waves')} w)" if shape else "-"

    head = ("| task | weight | candidates | " + " | ".join(f"best at {s} us" for s in shares)
            + " | " + " | ".join(f"{reference}'s best at {s} (x)" for s in shares if s != reference)
            + " | " + " | ".join(f"launch at {s}" for s in shares) + " |")
    lines = [f"Per task: each share's best kernel, and the kernel best at {reference} timed at the other shares "
             "(x: its time over that share's best). Launch: blocks x threads (waves on the share's SMs).", "",
             head, "| --- |" + " ---: |" * (2 + len(shares) + len(shares) - 1) + " --- |" * len(shares)]
    for row in rows:
        lines.append(f"| {row['task']} | {row['weight']} | {row['candidates']} | "
                     + " | ".join(str(row["best_us"][s]) for s in shares) + " | "
                     + " | ".join(f"{row['reference_best_us'][s]} ({row['reference_over_best'][s]})"
                                  for s in shares if s != reference) + " | "
                     + " | ".join(launch(row, s) for s in shares) + " |")
    totals = {s: sum(r["weight"] * r["best_us"][s] for r in rows) for s in shares}
    ref_totals = {s: sum(r["weight"] * r["reference_best_us"][s] for r in rows) for s in shares}
    lines += ["", "Sum over tasks (weight x us): " + ", ".join(
        f"at {s}: best {totals[s]:.1f}, {reference}'s {ref_totals[s]:.1f} ({ref_totals[s] / totals[s]:.4f}x)"
        for s in shares)]
    return _write_both(work, "study_tasks", {"reference": reference, "tasks": rows, "sum_best_us": totals,
                                             "sum_reference_us": ref_totals}, "\n".join(lines) + "\n")


def write_candidates(work: str, times: dict, report: dict, shares: list[str]) -> None:
    """W/study_candidates.csv: every candidate's mean us at every share (the raw data of the study, small
    enough to commit where the records are not)."""
    import hashlib

    names = {row["workload_hash"]: row["name"] for row in report.get("tasks", [])}
    with open(os.path.join(work, "study_candidates.csv"), "w") as fh:
        fh.write("task,trace_sha1," + ",".join(f"us_{s}" for s in shares) + "\n")
        for wk in sorted({wk for table in times.values() for wk in table}):
            for tk in sorted(set.union(*(set(times[s].get(wk, {})) for s in shares))):
                cells = [times[s].get(wk, {}).get(tk) for s in shares]
                fh.write(f"{names.get(wk, wk)},{hashlib.sha1(tk.encode()).hexdigest()[:12]},"
                         + ",".join("" if c is None else f"{c:.3f}" for c in cells) + "\n")


def plot(matrices: list[str], out: str) -> str:
    """One panel per study_matrix.json: p50 latency against the run-at share, a line per artifact
    (tuned at a share, or robust), the tuned-at shares marked. Returns what was written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(matrices), figsize=(5.2 * len(matrices), 4.2), squeeze=False)
    for ax, path in zip(axes[0], matrices):
        study = json.load(open(path))
        for artifact, row in study["p50_ms"].items():
            pcts = sorted(int(p) for p in row)
            style = dict(linestyle="--", linewidth=1.2) if artifact.startswith("robust") else dict(marker="o")
            ax.plot(pcts, [row[str(p)] for p in pcts], label=f"{artifact} (worst regret "
                    f"{study['worst_regret'][artifact]:.3f})", **style)
        ax.set_title(os.path.basename(os.path.dirname(os.path.abspath(path))) or path)
        ax.set_xlabel("run at share (% of the SMs, MPS)")
        ax.set_ylabel("p50 latency (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    m = sub.add_parser("matrix")
    m.add_argument("--work", required=True)
    m.add_argument("--kind", choices=("gpu", "cpu"), default="gpu")
    m.add_argument("--pcts", default="20,40,60,100")
    m.add_argument("--repeats", type=int, default=200)
    t = sub.add_parser("tasks")
    t.add_argument("--work", required=True)
    t.add_argument("--kind", choices=("gpu", "cpu"), default="gpu")
    t.add_argument("--reference", default=None, help="the share to compare against (default: <kind>100)")
    r = sub.add_parser("records", help="contradictions of the SM order, and the robust choice, from the records")
    r.add_argument("--work", required=True)
    r.add_argument("--kind", choices=("gpu", "cpu"), default="gpu")
    r.add_argument("--ratio", type=float, default=1.2)
    p = sub.add_parser("plot", help="latency against the run-at share, from study_matrix.json files")
    p.add_argument("matrices", nargs="+", help="study_matrix.json of each model (one panel each)")
    p.add_argument("--out", required=True, help="the .png to write")
    args = parser.parse_args(argv)
    if args.step == "plot":
        print(plot(args.matrices, args.out))
        return 0
    if args.step == "records":
        print(write_records(args.work, records_summary(args.work, args.kind, args.ratio)))
        return 0
    if args.step == "tasks":
        times = candidate_times(args.work, args.kind)
        shares = sorted(times, key=lambda s: int(s[len(args.kind):]))
        reference = args.reference or f"{args.kind}100"
        if reference not in times:
            print(f"no records-{reference} in {args.work}", file=sys.stderr)
            return 2
        report = json.load(open(os.path.join(args.work, "report.json")))
        merged = dict(report)
        for share in shares:  # task names and weights are in each share's report
            path = os.path.join(args.work, f"report-{share}.json")
            if os.path.isfile(path):
                merged["tasks"] = json.load(open(path)).get("tasks", [])
                break
        print(write_tasks(args.work, per_task(times, merged, shares, reference), shares, reference))
        write_candidates(args.work, times, merged, shares)
        return 0
    pcts = [int(p) for p in args.pcts.split(",")]
    found = artifacts(args.work, args.kind)
    if not found:
        print(f"no tuned artifacts in {args.work}", file=sys.stderr)
        return 2
    matrix, ran = measure(found, args.kind, pcts, args.repeats)
    study = summarize(matrix, args.kind, pcts)
    study["variant_ran"] = ran  # the share-robust artifact: which share's schedules ran at each share
    print(write(args.work, study, args.kind, pcts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
