"""Measurements that disturb each other (issue 15): what measuring at several shares at once does to
the timings, and what the per-device measurement lock costs.

    python benchmarks/measure_noise.py --out-dir DIR --pcts 20,40,100 --kind gpu --candidates 24 \
        --rounds 3 --results benchmarks/results/NAME/measure_noise.md
    python benchmarks/measure_noise.py --out-dir DIR --kind cpu --pcts 50,100 ...   (CPU shares)

DIR is a `tunekit tune` out dir: the records of its first records-<share>/ (or --records-share)
give up to --candidates distinct measured schedules (the fastest of each workload first, round-robin
over workloads ordered by their best time). They are built once, then measured --rounds times at
every share of --pcts in three modes (rounds interleaved, so a drift of the machine hits each mode):
  alone       one share at a time, nothing else measuring (the reference);
  concurrent  every candidate at every share at once, without the lock (measure-every-share with
              --measure-lock off);
  locked      the same, with the device's measurement lock (shares/measure_lock.py): shares take turns.
Per share: the median and p90 over candidates of |mean time in mode / mean time alone - 1| and the
median coefficient of variation over rounds; per mode: measurements per second (candidates x shares
x rounds / wall) and the lock's cost (locked wall / concurrent wall). A markdown table goes to
stdout and --results, the raw numbers to the same name with .json; progress to stderr.

    python benchmarks/measure_noise.py --out-dir DIR --pcts 20,40,100 --suspects 1.2 --modes alone ...

--suspects R asks whether the records' own timings can be trusted: it takes the candidates whose
records contradict the shares' SM counts (measured more than R x slower at a share with more SMs
than at one with fewer, which more SMs cannot do to a kernel whose launch does not change), and as
many consistent ones from the same workloads, and re-measures them all. The per-candidate table
says, for each, its recorded and re-measured time at every share, and whether the contradiction
came back.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np
import tvm_ffi
from tvm.s_tir.meta_schedule.builder import BuilderInput
from tvm.s_tir.meta_schedule.runner import RunnerInput

from tunekit.clients.build_pool import BuildPool
from tunekit.metaschedule_env import import_for_target
from tunekit.clients.multi_share import MultiShareRunner
from tunekit.clients.session_runner import RunnerConfig, SessionRunner
from tunekit.errors import TunekitError
from tunekit.records.database import find_share_databases, mean_run_us, open_database
from tunekit.run.session import ShareSession
from tunekit.servers.fleet import FleetConfig, RunnerFleet
from tunekit.shares.cpu import cpu_model
from tunekit.shares.share import Share, parse_pct_list
from tunekit.targets import target_for

MODES = ("alone", "concurrent", "locked")


def log(message: str) -> None:
    print(f"measure_noise: {message}", file=sys.stderr, flush=True)


def parse_shares(text: str, kind: str) -> list:
    """'20,40,100' -> Shares, the largest first (its session holds the others: run/session.py)."""
    try:
        shares = parse_pct_list(text, kind=kind)
    except TunekitError as exc:  # its message names tunekit's --<kind>-pct; ours is --pcts
        raise SystemExit(f"measure_noise: {str(exc).replace(f'--{kind}-pct', '--pcts')}") from None
    if len({s.pct for s in shares}) != len(shares) or len(shares) < 2:
        raise SystemExit(f"measure_noise: --pcts needs at least two distinct percentages, got {text!r}")
    return sorted(shares, key=lambda s: -s.pct)


def records_dir(out_dir: str, label: str | None) -> tuple[str, str]:
    """(share label, database dir) of the records to replay: --records-share, else the first found."""
    found = find_share_databases(out_dir)
    if label is not None and label not in found:
        raise SystemExit(f"measure_noise: no records-{label} under {out_dir} (found: {', '.join(found)})")
    label = label or next(iter(found))
    return label, found[label]


def pick_records(path: str, count: int) -> list:
    """Distinct successful records, the fastest of each workload first, round-robin over workloads."""
    per_workload, seen = {}, set()
    import_for_target("cuda")  # a CUDA trace names tensor intrinsics: registered before it is parsed
    for record in open_database(path, read_only=True).get_all_tuning_records():
        us = mean_run_us(record.run_secs)
        workload = tvm_ffi.structural_hash(record.workload.mod)
        key = (workload, str(record.trace))  # the same schedule measured twice is one candidate
        if us is None or key in seen:
            continue
        seen.add(key)
        per_workload.setdefault(workload, []).append((us, record))
    lists = sorted((sorted(found, key=lambda x: x[0]) for found in per_workload.values()), key=lambda l: l[0][0])
    picked = [lst[i][1] for i in range(max(map(len, lists), default=0)) for lst in lists if i < len(lst)]
    if not picked:
        raise SystemExit(f"measure_noise: no successful records in {path}")
    log(f"{min(count, len(picked))} candidates from {len(lists)} workloads in {path}")
    return picked[:count]


def times_at_every_share(out_dir: str) -> dict:
    """{(workload hash, trace text): {share label: recorded µs}} over every records-<share> of a run."""
    table = {}
    import_for_target("cuda")
    for label, path in find_share_databases(out_dir).items():
        for record in open_database(path, read_only=True).get_all_tuning_records():
            us = mean_run_us(record.run_secs)
            if us is not None:
                table.setdefault((tvm_ffi.structural_hash(record.workload.mod), str(record.trace)), {})[label] = us
    return table


def contradiction(times: dict, labels: list) -> float:
    """The largest ratio (time at a share with more SMs) / (time at one with fewer): > 1 contradicts."""
    by_pct = sorted(labels, key=lambda label: Share.from_label(label).pct)
    return max(times[hi] / times[lo] for i, lo in enumerate(by_pct) for hi in by_pct[i + 1:])


def pick_suspects(path: str, table: dict, labels: list, ratio: float, count: int) -> list:
    """[(record, its key in `table`)]: up to count // 2 candidates whose recorded times contradict the
    shares' SM order by more than `ratio` (the worst first), then a consistent candidate (<= 1.05) of
    each suspect's workload, the fastest, as its control."""
    measured = {k: v for k, v in table.items() if all(label in v for label in labels)}
    suspects, controls, seen = [], {}, set()
    for record in open_database(path, read_only=True).get_all_tuning_records():
        key = (tvm_ffi.structural_hash(record.workload.mod), str(record.trace))
        if key not in measured or key in seen:
            continue
        seen.add(key)
        worst = contradiction(measured[key], labels)
        if worst > ratio:
            suspects.append((worst, record, key))
        elif worst <= 1.05:
            controls.setdefault(key[0], []).append((measured[key][labels[0]], record, key))
    suspects = sorted(suspects, key=lambda x: -x[0])[:max(1, count // 2)]
    picked = [(record, key) for _, record, key in suspects]
    for _, _, (workload, _) in suspects:
        unused = [(us, r, k) for us, r, k in controls.get(workload, []) if all(k != key for _, key in picked)]
        if unused and len(picked) < count:
            _, record, key = min(unused, key=lambda x: x[0])
            picked.append((record, key))
    log(f"{len(suspects)} suspects (recorded contradiction > {ratio}) and {len(picked) - len(suspects)} controls "
        f"among {len(measured)} candidates measured at {', '.join(labels)}")
    if not suspects:
        raise SystemExit(f"measure_noise: no candidate contradicts the shares by more than {ratio}")
    return picked


def record_targets(records, share, kind: str) -> list:
    """Each record's target (else the one tunekit tunes for at its share), checked against --kind."""
    targets = [record.target or target_for(share) for record in records]
    if (targets[0].kind.name == "cuda") != (kind == "gpu"):
        raise SystemExit(f"measure_noise: the records were tuned for {targets[0].kind.name}, not for --kind {kind}")
    return targets


def build(records, targets: list, work_dir: str) -> tuple[list, list]:
    """Each record's trace replayed and built once: (RunnerInputs every mode and share measures, the
    index in `records` of each)."""
    target_kind = targets[0].kind.name
    import_for_target(target_kind)  # registers the CUDA tensor intrinsics the traces name
    candidates = [record.as_measure_candidate() for record in records]
    cores = sorted(os.sched_getaffinity(0))
    pool = BuildPool(workers=min(len(cores), len(candidates)), timeout_s=120, cores=cores,
                     cuda_aot=target_kind == "cuda", artifact_dir=os.path.join(work_dir, "artifacts"))
    try:  # built before any share measures, so building never disturbs a timing
        built = pool.build([BuilderInput(c.sch.mod, t) for c, t in zip(candidates, targets)])
    finally:
        pool.shutdown()
    device = "cuda" if target_kind == "cuda" else "cpu"
    kept = [i for i, b in enumerate(built) if not b.error_msg]
    inputs = [RunnerInput(built[i].artifact_path, device, candidates[i].args_info) for i in kept]
    log(f"built {len(inputs)} of {len(built)} candidates")
    if not inputs:
        raise SystemExit(f"measure_noise: no candidate built ({built[0].error_msg.splitlines()[-1][:200]})")
    return inputs, kept


@contextlib.contextmanager
def share_fleets(shares):
    """{label: fleet}: one session per share (the largest holds the others), one server each."""
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(ShareSession(shares[0], allow_unenforced=False))
        fleets = {}
        for share in shares:
            session = first if share is shares[0] else stack.enter_context(
                ShareSession(share, allow_unenforced=False, within=first))
            fleets[share.label] = stack.enter_context(RunnerFleet(
                key=f"noise-{share.label}", pinned=session.pinned, config=FleetConfig(servers=1)))
        yield fleets


@contextlib.contextmanager
def runners(fleets: dict, kind: str, lock: bool, warm_input):
    """A SessionRunner per share; shut down on exit, so the next mode's runners get the servers."""
    made = {label: SessionRunner(RunnerConfig(tracker_port=fleet.tracker_port, key=fleet.key, sessions=1,
                                              measure_lock=lock, label=label,
                                              lock_device="cpu" if kind == "cpu" and lock else None),
                                 on_hang=fleet.stop_server_on_port)
            for label, fleet in fleets.items()}
    try:
        for runner in made.values():  # open each session and warm it up, outside the timed part
            runner.run([warm_input])[0].result()
        yield made
    finally:
        for runner in made.values():
            runner.shutdown()
        time.sleep(0.5)  # the sessions close as the threads exit: let the servers re-register


def measure_round(mode: str, fleets: dict, kind: str, inputs: list) -> tuple[dict, float, dict]:
    """One round of `mode` over every candidate: ({label: [µs or None]}, wall s, {label: lock wait s})."""
    mean_us = lambda result: None if result.error_msg else mean_run_us(result.run_secs)  # noqa: E731
    with runners(fleets, kind, mode == "locked", inputs[0]) as made:
        times, wall = {}, 0.0
        if mode == "alone":
            for label, runner in made.items():
                started = time.perf_counter()
                times[label] = [mean_us(f.result()) for f in runner.run(inputs)]
                wall += time.perf_counter() - started
        else:
            started = time.perf_counter()
            results = [f.results() for f in MultiShareRunner(made).run(inputs)]
            wall = time.perf_counter() - started
            times = {label: [mean_us(r[label]) for r in results] for label in made}
        waits = {label: sum(getattr(runner.timings.pop(str(i.artifact_path), None), "lock_wait_s", 0.0)
                            for i in inputs) for label, runner in made.items()}
    return times, wall, waits


def summarize(raw: dict, labels: list, n: int, modes=MODES) -> dict:
    """Per share and mode: deviation from alone (%, median and p90) and CV over rounds (%)."""
    def per_candidate(mode, label):  # [[µs per round] per candidate], None where any round failed
        rounds = [r["times"][label] for r in raw["rounds"] if r["mode"] == mode]
        return [None if any(r[c] is None for r in rounds) else [r[c] for r in rounds] for c in range(n)]

    out = {}
    for label in labels:
        alone = per_candidate("alone", label)
        for mode in modes:
            got = per_candidate(mode, label)
            ok = [c for c in range(n) if got[c] and alone[c]]
            devs = [abs(np.mean(got[c]) / np.mean(alone[c]) - 1) * 100 for c in ok]
            cvs = [np.std(got[c], ddof=1) / np.mean(got[c]) * 100 for c in ok if len(got[c]) > 1]
            out[f"{label}/{mode}"] = {
                "candidates": len(ok), "median_dev_pct": float(np.median(devs)) if devs and mode != "alone" else None,
                "p90_dev_pct": float(np.percentile(devs, 90)) if devs and mode != "alone" else None,
                "median_cv_pct": float(np.median(cvs)) if cvs else None,
                "lock_wait_s": sum(r["lock_wait_s"][label] for r in raw["rounds"] if r["mode"] == mode)}
    for mode in modes:
        wall = sum(r["wall_s"] for r in raw["rounds"] if r["mode"] == mode)
        out[mode] = {"wall_s": wall, "per_s": n * len(labels) * raw["rounds_per_mode"] / wall}
    if "locked" in modes and "concurrent" in modes:
        out["lock_cost"] = out["locked"]["wall_s"] / out["concurrent"]["wall_s"]
    return out


def render(summary: dict, labels: list, header: list, modes=MODES) -> str:
    fmt = lambda v, spec=".1f": "-" if v is None else format(v, spec)  # noqa: E731
    lines = [*header, "", "| share | mode | candidates | median \\|Δ\\| vs alone % | p90 \\|Δ\\| vs alone % "
             "| median CV over rounds % | lock wait s |", "|---|---|---:|---:|---:|---:|---:|"]
    for label in labels:
        for mode in modes:
            s = summary[f"{label}/{mode}"]
            lines.append(f"| {label} | {mode} | {s['candidates']} | {fmt(s['median_dev_pct'])} | "
                         f"{fmt(s['p90_dev_pct'])} | {fmt(s['median_cv_pct'])} | {fmt(s['lock_wait_s'], '.2f')} |")
    lines += ["", "| mode | wall s | measurements/s |", "|---|---:|---:|"]
    for mode in modes:
        s = summary[mode]
        lines.append(f"| {mode} | {s['wall_s']:.1f} | {s['per_s']:.2f} |")
    if "lock_cost" in summary:
        lines += ["", f"Lock cost (locked wall / concurrent wall): {summary['lock_cost']:.2f}x"]
    return "\n".join(lines) + "\n"


def recheck(raw: dict, labels: list, keys: list, table: dict, n_suspects: int, ratio: float) -> tuple[list, str]:
    """--suspects: per candidate, recorded vs re-measured (median of the alone rounds) at each share,
    and whether the recorded contradiction of the SM order came back."""
    rows, lines = [], []
    for c, key in enumerate(keys):
        again = {}
        for label in labels:
            got = [r["times"][label][c] for r in raw["rounds"] if r["mode"] == "alone" and r["times"][label][c]]
            again[label] = float(np.median(got)) if got else None
        recorded = table[key]
        row = {"suspect": c < n_suspects, "workload": f"{key[0] & 0xFFFFFFFFFFFFFFFF:016x}",
               "recorded_us": {label: recorded[label] for label in labels}, "remeasured_us": again,
               "recorded_contradiction": contradiction(recorded, labels),
               "remeasured_contradiction": contradiction(again, labels) if all(again.values()) else None}
        rows.append(row)
    fmt = lambda v: "-" if v is None else f"{v:.2f}"  # noqa: E731
    lines += ["", f"## Recorded vs re-measured (µs; contradiction: the largest time at more SMs / time at fewer)", "",
              "| candidate | workload | " + " | ".join(f"{l} recorded | {l} again" for l in labels)
              + " | contradiction recorded | again |", "|---|---|" + "---:|---:|" * len(labels) + "---:|---:|"]
    for row in rows:
        cells = " | ".join(f"{fmt(row['recorded_us'][l])} | {fmt(row['remeasured_us'][l])}" for l in labels)
        lines.append(f"| {'suspect' if row['suspect'] else 'control'} | {row['workload']} | {cells} | "
                     f"{row['recorded_contradiction']:.2f} | {fmt(row['remeasured_contradiction'])} |")
    came_back = [r for r in rows if r["suspect"] and (r["remeasured_contradiction"] or 0) > ratio]
    suspects = [r for r in rows if r["suspect"]]
    lines += ["", f"Suspects whose contradiction (> {ratio}) came back when re-measured: {len(came_back)} of "
              f"{len(suspects)}; controls now over {ratio}: "
              f"{sum(1 for r in rows if not r['suspect'] and (r['remeasured_contradiction'] or 0) > ratio)} of "
              f"{len(rows) - len(suspects)}."]
    return rows, "\n".join(lines) + "\n"


def machine(kind: str) -> str:
    """What the numbers were measured on, for the report's header."""
    try:
        return cpu_model() if kind == "cpu" else subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
            timeout=30).stdout.splitlines()[0].strip()
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown GPU"


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out-dir", required=True, help="a `tunekit tune` out dir (records-<share>/ inside)")
    parser.add_argument("--pcts", required=True, help="shares to measure at, e.g. 20,40,100")
    parser.add_argument("--kind", choices=("gpu", "cpu"), default="gpu")
    parser.add_argument("--candidates", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--records-share", help="which records-<share> to take (default: the first)")
    parser.add_argument("--results", required=True, help="the markdown report (.json beside it)")
    parser.add_argument("--modes", default=",".join(MODES), help="which of alone,concurrent,locked (alone always)")
    parser.add_argument("--suspects", type=float, metavar="RATIO",
                        help="re-measure the candidates whose records contradict the shares' SM order by more "
                             "than RATIO, beside consistent ones of the same workloads (module docstring)")
    args = parser.parse_args(argv)
    if args.candidates < 1 or args.rounds < 1:
        raise SystemExit("measure_noise: --candidates and --rounds must be at least 1")
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if any(m not in MODES for m in modes):
        raise SystemExit(f"measure_noise: --modes takes {', '.join(MODES)}, got {args.modes!r}")
    args.modes = [m for m in MODES if m in modes or m == "alone"]
    if args.suspects is not None and args.suspects <= 1:
        raise SystemExit("measure_noise: --suspects RATIO must be above 1")
    return args


def run(args, command: str) -> None:
    shares = parse_shares(args.pcts, args.kind)
    labels = [s.label for s in shares]
    records_label, path = records_dir(args.out_dir, args.records_share)
    os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)  # fail now, not after the run
    if args.suspects:
        table = times_at_every_share(args.out_dir)
        picked = pick_suspects(path, table, labels, args.suspects, args.candidates)
        records, keys = [r for r, _ in picked], [k for _, k in picked]
        n_suspects = sum(1 for k in keys if contradiction(table[k], labels) > args.suspects)
    else:
        records = pick_records(path, args.candidates)
    targets = record_targets(records, Share.from_label(records_label), args.kind)
    work_dir = tempfile.mkdtemp(prefix="measure-noise-")
    try:  # the shares first: no MPS, or the device booked by another job, fails before the builds
        with share_fleets(shares) as fleets:
            inputs, kept = build(records, targets, work_dir)
            raw = {"labels": labels, "rounds_per_mode": args.rounds, "rounds": [],
                   "artifacts": [os.path.basename(str(i.artifact_path)) for i in inputs]}
            for round_no in range(args.rounds):
                for mode in args.modes:  # interleaved: a slow drift of the machine hits every mode alike
                    times, wall, waits = measure_round(mode, fleets, args.kind, inputs)
                    raw["rounds"].append({"mode": mode, "round": round_no, "wall_s": wall, "times": times,
                                          "lock_wait_s": waits})
                    log(f"round {round_no + 1}/{args.rounds} {mode}: {wall:.1f} s")
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    summary = summarize(raw, labels, len(inputs), args.modes)
    now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    header = ["# Measurement noise across shares (issue 15)", "", f"- machine: {machine(args.kind)}",
              f"- command: `{command}`", f"- date: {now}",
              f"- records: {path} ({len(inputs)} candidates), shares {', '.join(labels)}, {args.rounds} rounds"]
    report = render(summary, labels, header, args.modes)
    rows = None
    if args.suspects:
        keys = [keys[i] for i in kept]
        rows, text = recheck(raw, labels, keys, table, sum(1 for i in kept if i < n_suspects), args.suspects)
        report += text
    print(report)
    with open(args.results, "w") as fh:
        fh.write(report)
    with open(os.path.splitext(args.results)[0] + ".json", "w") as fh:
        json.dump({"header": header, "summary": summary, "raw": raw, "recheck": rows}, fh, indent=1)
    log(f"wrote {args.results}")


def main(argv=None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    try:  # tunekit's own errors (no records, a bad share, no MPS, the device booked) in one line
        run(args, "python " + shlex.join(sys.argv if argv is None else ["benchmarks/measure_noise.py", *argv]))
    except TunekitError as exc:
        raise SystemExit(f"measure_noise: {exc}") from None


if __name__ == "__main__":
    main()
