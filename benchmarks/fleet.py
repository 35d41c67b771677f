"""A fleet against its models tuned one after another and side by side, with the same wall-clock budget.

Three setups, each given `--budget` seconds of tuning in all, each model at its own share:
- fleet:       `tunekit tune fleet.yaml --time-budget B` (one search, one budget);
- sequential:  `tunekit tune m.onnx --<kind>-pct P --time-budget B/n` for each model, one after another;
- parallel:    the same per model with `--time-budget B`, all processes at once (the ledger lets them share).
The models are example models at one share (`--models`, `--share`), or ONNX files each with its share and weight
(`--fleet FILE`, as `tunekit tune FILE` reads it). Every artifact is then timed again with `tunekit bench` at its
share, the setups in turns (`--rounds`), so that the ratios compare artifacts timed side by side.

Each model's latency over a setup's wall is traced from its report: the tasks' weighted sum, each task at the last
time it fell to by then (`tasks[].fell_at`). That gives when every model first reaches the latency it got tuned
alone in the sequential setup (its "solo" latency, within `--tolerance`): issue 54's "wall time until every model
reaches the latency it gets alone", fleet against sequential.

`--setups fleet-sum` also tunes the fleet with `fleet_objective: sum` (the weighted sum of latencies, Ansor's
objective) beside the three, whose fleet has the default (one process: the geometric mean).
`--setups` tunes only some setups and `--work` keeps their outputs and runs.json; `--runs` reads setups tuned before
(e.g. the sequential setup on a second GPU at the same time), and the table is made once all three are there.
`--alone-on 2,2,3,3` tunes the sequential setup's models each alone on a GPU of its own (those listed, each with its
`--cores-per-gpu` cores), the GPUs at once: the setup is then composed one after another from them (its wall the sum
of their walls, each model's curve shifted by the walls before it), which is what one GPU gives in turn.

Prints and writes (`--results`) one Markdown table: per setup, each model's tuned latency, the weighted sum, its
ratio to sequential, trials, the tuning wall, and the wall until every model reached its solo latency.

  python benchmarks/fleet.py --share cpu50 --budget 180              # the CPU version in `make bench`
  python benchmarks/fleet.py --fleet fleet.yaml --budget 1200             # e.g. four zoo models on a GPU
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tuning_time import write_results  # noqa: E402  (the same machine line as every benchmark)

SETUPS = ("fleet", "sequential", "parallel")
# setups tuned only when --setups names them: the fleet with a fleet-level setting changed
VARIANTS = {"fleet-sum": {"fleet_objective": "sum"}}


@dataclass(frozen=True)
class Member:
    path: str
    kind: str      # gpu or cpu
    pct: int
    weight: float = 1.0
    name: str = ""

    @property
    def flag(self) -> list[str]:
        return [f"--{self.kind}-pct", str(self.pct)]


def members_of(fleet_file: str) -> list[Member]:
    """The fleet file's models with their shares (a model's own, else the file's) and weights."""
    from tunekit.config import load_fleet_file

    models, values = load_fleet_file(fleet_file)
    out = []
    for i, m in enumerate(models):
        kind = "gpu" if (m.gpu_pct or values.get("gpu_pct")) else "cpu"
        pct = m.gpu_pct or m.cpu_pct or values.get(f"{kind}_pct")
        if not pct:
            raise SystemExit(f"{fleet_file}: {m.model} has no share (gpu_pct or cpu_pct)")
        out.append(Member(m.model, kind, int(pct), m.weight, m.name or f"m{i}"))
    return out


def fleet_yaml(members: list[Member], path: str, settings: dict | None = None) -> str:
    import yaml

    with open(path, "w") as fh:
        yaml.safe_dump({**(settings or {}), "models": [{"model": m.path, f"{m.kind}_pct": m.pct, "weight": m.weight,
                                                        "name": m.name} for m in members]}, fh)
    return path


def make_models(specs: str, *, image: int, work: str) -> list[str]:
    """`name[:key=value...]` example models (tunekit.models.examples), e.g. resnet18:classes=10, at `image`."""
    from tunekit.models.examples import save_example

    paths = []
    for i, spec in enumerate(specs.split(",")):
        name, *options = spec.split(":")
        kwargs = {"image": image, **{k: int(v) for k, v in (o.split("=") for o in options)}}
        if name == "resnet18":
            kwargs.setdefault("width", 32)
        paths.append(save_example(name, os.path.join(work, f"m{i}-{name}.onnx"), seed=i, **kwargs))
    return paths


def tunekit(*args: str) -> tuple[dict, float]:
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "tunekit.cli", *args, "--json"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"tunekit {' '.join(args)} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    return json.loads(proc.stdout), time.perf_counter() - started


def _tune_args(budget: float, out: str) -> list[str]:
    return ["--time-budget", f"{budget:g}", "--trials", "1000000", "--out", out]


def estimated_ms(tasks: list[dict], at: float | None = None) -> float:
    """A model's latency as its tasks' weighted sum (ms) at unix time `at` (None: at the end): each task at its
    untuned time until the first time it fell (report `tasks[].fell_at`), then at the last it fell to by `at`."""
    total = 0.0
    for task in tasks:
        fell = [us for when, us in task.get("fell_at", []) if at is None or when <= at]
        start = task.get("untuned_us") or next((us for _, us in task.get("fell_at", [])), None)
        us = fell[-1] if fell else start
        total += task["weight"] * us if us is not None else 0.0
    return total / 1000


def estimated_curve(reports: list[dict], started: float) -> list:
    """[(seconds since `started`, [each model's estimated ms])] at every time one of the models' tasks fell."""
    times = sorted({when for report in reports for task in report["tasks"] for when, _ in task.get("fell_at", [])})
    return [(when - started, [estimated_ms(report["tasks"], when) for report in reports]) for when in times]


def trials_by(tasks: list[dict], at: float) -> int:
    """A model's trials measured by unix time `at` (report `tasks[].measured_at`; a workload that two models of a
    fleet share counts in both)."""
    return sum(next((n for when, n in reversed(task.get("measured_at", [])) if when <= at), 0) for task in tasks)


def trials_curve(reports: list[dict], started: float) -> list:
    """[(seconds since `started`, [each model's trials so far])] at every time a batch of one of them came back."""
    times = sorted({when for report in reports for task in report["tasks"] for when, _ in task.get("measured_at", [])})
    return [(when - started, [trials_by(report["tasks"], when) for report in reports]) for when in times]


def _setup(artifacts, reports, *, started: float, trials: int, wall_s: float | None = None) -> dict:
    return {"artifacts": artifacts, "wall_s": time.time() - started if wall_s is None else wall_s, "trials": trials,
            "curve": estimated_curve(reports, started), "estimated_ms": [estimated_ms(r["tasks"]) for r in reports],
            "trials_curve": trials_curve(reports, started)}


def one_after_another(reports: list[dict], starts: list[float], walls: list[float], *, base: float = 0.0) -> list[dict]:
    """Reports of models tuned at the same time, each alone on its own device, with their times moved to where
    they would be had each started when the one before ended: model i's `fell_at` times shifted from its start
    `starts[i]` to `base` + the walls of the models before it."""
    moved, offset = [], base
    for report, start, wall in zip(reports, starts, walls):
        shift = offset - start
        moved.append({**report, "tasks": [{**task, **{key: [[when + shift, value] for when, value in task.get(key, [])]
                                                      for key in ("fell_at", "measured_at")}}
                                          for task in report["tasks"]]})
        offset += wall
    return moved


def _alone(members: list[Member], gpus: list[int], *, budget: float, work: str, cores: int) -> dict:
    """The sequential setup from each model tuned alone on its GPU (`gpus[i]`), the GPUs at once; models given the
    same GPU run one after another on it, on that GPU's `cores` cores."""
    import threading

    found: dict[int, tuple] = {}

    def stream(gpu: int) -> None:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
        for i in [i for i, g in enumerate(gpus) if g == gpu]:
            m, started = members[i], time.time()
            cmd = ["taskset", "-c", f"{gpu * cores}-{gpu * cores + cores - 1}", sys.executable, "-m", "tunekit.cli",
                   "tune", m.path, *m.flag, *_tune_args(budget, os.path.join(work, f"seq{i}")), "--json"]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            found[i] = (proc, started, time.time() - started)

    threads = [threading.Thread(target=stream, args=(gpu,)) for gpu in sorted(set(gpus))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for i in range(len(members)):
        proc = found[i][0]
        if proc.returncode != 0:
            raise SystemExit(f"{members[i].name} alone failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    payloads = [json.loads(found[i][0].stdout) for i in range(len(members))]
    walls = [found[i][2] for i in range(len(members))]
    reports = one_after_another([p["report"] for p in payloads], [found[i][1] for i in range(len(members))], walls)
    return {**_setup([p["artifact"] for p in payloads], reports, started=0.0, trials=sum(p["trials"] for p in payloads),
                     wall_s=sum(walls)), "alone_on": gpus, "walls_s": walls}


def run_setups(members: list[Member], *, budget: float, work: str, setups: tuple[str, ...],
               fleet_args: tuple[str, ...] = (), alone_on: list[int] | None = None, cores_per_gpu: int = 16) -> dict:
    """{setup: {"artifacts", "wall_s", "trials", "curve", "estimated_ms"}} for each of `setups`, each written to
    <work>/runs.json as it ends (the curve: benchmarks.fleet.estimated_curve, from the tune reports). `fleet_args`:
    more options of the fleet's command (e.g. `--clients 2`: its search sharded over Ray tuning clients);
    `alone_on`: each model's GPU for the sequential setup (module doc)."""
    n, out = len(members), {}

    def done(setup: str, result: dict) -> None:
        out[setup] = result
        with open(os.path.join(work, "runs.json"), "w") as fh:
            json.dump(out, fh, indent=1)

    for setup in [s for s in ("fleet", *VARIANTS) if s in setups]:
        started = time.time()
        payload, _ = tunekit("tune", fleet_yaml(members, os.path.join(work, f"{setup}.yaml"), VARIANTS.get(setup)),
                             *_tune_args(budget, os.path.join(work, setup)), *fleet_args)
        rows = payload["report"]["fleet"]  # in the file's order; a model that failed fails the tune (exit 1)
        reports = []
        for row in rows:
            with open(row["report"]) as fh:
                reports.append(json.load(fh))
        done(setup, _setup([row["artifact"] for row in rows], reports, started=started,
                           trials=sum(payload["report"]["trials"]["measured"].values())))
    if "sequential" in setups and alone_on:
        done("sequential", _alone(members, alone_on, budget=budget / n, work=work, cores=cores_per_gpu))
    elif "sequential" in setups:
        started, payloads = time.time(), []
        for i, m in enumerate(members):
            payloads.append(tunekit("tune", m.path, *m.flag, *_tune_args(budget / n, os.path.join(work, f"seq{i}")))[0])
        done("sequential", _setup([p["artifact"] for p in payloads], [p["report"] for p in payloads],
                                  started=started, trials=sum(p["trials"] for p in payloads)))
    if "parallel" in setups:
        started = time.time()
        procs = [subprocess.Popen([sys.executable, "-m", "tunekit.cli", "tune", m.path, *m.flag,
                                   *_tune_args(budget, os.path.join(work, f"par{i}")), "--json",
                                   "--wait-for-share", "600"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for i, m in enumerate(members)]
        results = [proc.communicate() for proc in procs]
        for proc, (_, stderr) in zip(procs, results):
            if proc.returncode != 0:
                raise SystemExit(f"a parallel tune failed: {(stderr.strip().splitlines() or ['?'])[-1]}")
        payloads = [json.loads(stdout) for stdout, _ in results]
        done("parallel", _setup([p["artifact"] for p in payloads], [p["report"] for p in payloads],
                                started=started, trials=sum(p["trials"] for p in payloads)))
    return out


def reached_at(curve: list, solo: list[float], *, tolerance: float) -> float | None:
    """The wall at the first point of `curve` where every model's latency is within `tolerance` of its solo
    latency, or None when none is."""
    return next((wall for wall, latencies in curve
                 if all(t <= s * (1 + tolerance) for t, s in zip(latencies, solo))), None)


def model_reached_at(curve: list, i: int, solo: float, *, tolerance: float) -> float | None:
    """The wall at which model `i`'s latency in `curve` first came within `tolerance` of its solo latency."""
    return next((wall for wall, latencies in curve if latencies[i] <= solo * (1 + tolerance)), None)


def longest_flat(curve: list, i: int, *, until: float | None = None) -> tuple[float, float]:
    """(start, end) of the longest stretch of `curve` (up to `until`) in which model `i`'s latency did not fall while
    another model's did: the fleet's trials went elsewhere, or bought it nothing, while it was still short of its solo
    latency. (0, 0) where there is none."""
    longest, since = (0.0, 0.0), None
    for (wall, latencies), (before_wall, before) in zip(curve[1:], curve):
        if until is not None and wall > until:
            break
        if latencies[i] < before[i]:
            since = None
        elif any(now < then for now, then in zip(latencies, before)):
            since = before_wall if since is None else since
            longest = max(longest, (since, wall), key=lambda stretch: stretch[1] - stretch[0])
    return longest


def trials_between(trials: list, i: int, start: float, end: float) -> int:
    """Model `i`'s trials measured between `start` and `end` (a trials_curve)."""
    def by(at: float) -> int:
        return next((counts[i] for wall, counts in reversed(trials) if wall <= at), 0)
    return by(end) - by(start)


def per_model_table(members: list[Member], runs: dict, *, tolerance: float) -> str:
    """Per model and setup: the wall at which it reached its solo latency, and (in brackets) the longest stretch
    before that in which it stood still while another model fell (longest_flat), with the trials it got in it where
    the run has its trials over time (trials_curve; runs of tunekit before it have none)."""
    solo = runs["sequential"]["estimated_ms"]
    lines = [f"| model | {' | '.join(runs)} |", "| --- |" + " ---: |" * len(runs)]
    for i, m in enumerate(members):
        cells = []
        for run in runs.values():
            at = model_reached_at(run["curve"], i, solo[i], tolerance=tolerance)
            start, end = longest_flat(run["curve"], i, until=at)
            got = f", {trials_between(run['trials_curve'], i, start, end)} trials" if run.get("trials_curve") else ""
            cells.append(("not reached" if at is None else f"{at:.0f}") + f" ({end - start:.0f} s{got})")
        lines.append(f"| {m.name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + ("\n\nEach model's wall until its solo latency, s (in brackets: the longest stretch "
                               "before it in which its estimate stood still while another model's fell, and the "
                               "trials it got in that stretch).")


def bench_all(runs: dict, members: list[Member], *, rounds: int) -> dict:
    """{setup: [median over rounds of each model's p50 ms]}: every artifact timed once per round, setups in turns."""
    times = {setup: [[] for _ in run["artifacts"]] for setup, run in runs.items()}
    for _ in range(rounds):
        for setup, run in runs.items():
            for i, (artifact, m) in enumerate(zip(run["artifacts"], members)):
                payload, _ = tunekit("bench", artifact, *m.flag, "--repeats", "50")
                times[setup][i].append(payload["p50_ms"])
    return {setup: [statistics.median(t) for t in per_model] for setup, per_model in times.items()}


def table(members: list[Member], runs: dict, latency: dict, *, tolerance: float) -> str:
    """Per setup: each model's latency, the weighted sum and its ratio to sequential, trials, wall, and the wall until
    every model reached its solo latency with its ratio. Latencies over time are the reports' estimates (tasks'
    weighted sums); a model's solo latency is its estimate at the end of the sequential setup (tuned alone for
    budget / n)."""
    weighted = {setup: sum(m.weight * t for m, t in zip(members, latency[setup])) for setup in runs}
    solo = runs["sequential"]["estimated_ms"]
    reached = {setup: reached_at(run["curve"], solo, tolerance=tolerance) for setup, run in runs.items()}
    lines = [f"| setup | {' | '.join(f'{m.name} ({m.kind}{m.pct}, x{m.weight:g}) ms' for m in members)} | weighted sum ms "
             f"| / sequential | trials | wall s | every model at its solo latency, s | / sequential |",
             "| --- |" + " ---: |" * (len(members) + 6)]
    for setup in runs:
        at, base = reached[setup], reached["sequential"]
        lines.append(f"| {setup} | " + " | ".join(f"{t:.4f}" for t in latency[setup])
                     + f" | {weighted[setup]:.4f} | {weighted[setup] / weighted['sequential']:.3f} | "
                     f"{runs[setup]['trials']} | {runs[setup]['wall_s']:.0f} | "
                     + (f"{at:.0f}" if at is not None else "not reached") + " | "
                     + (f"{at / base:.3f}" if at is not None and base else "–") + " |")
    return "\n".join(lines) + (f"\n\nSolo latency: each model's estimated latency (its tasks' weighted sum) at the end "
                                f"of the sequential setup (tuned alone for budget / {len(members)}), within "
                                f"{tolerance:.0%}; a setup reaches it when every model's estimate, traced from the "
                                f"times its tasks fell (report tasks[].fell_at), is there. Walls from each setup's "
                                f"start; latencies in the model columns are `tunekit bench` p50s."
                                + (f" The sequential setup was tuned alone on GPUs {runs['sequential']['alone_on']} "
                                   f"at once and composed in turn (walls {', '.join(f'{w:.0f}' for w in runs['sequential']['walls_s'])} s)."
                                   if runs["sequential"].get("alone_on") else ""))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--fleet", help="a fleet YAML of ONNX models, each with its share and weight (else --models)")
    p.add_argument("--models", default="resnet18,mobilenet", help="example models, name[:key=value...] each")
    p.add_argument("--image", type=int, default=64)
    p.add_argument("--share", default="cpu50", help="every example model's share, e.g. cpu50 or gpu25")
    p.add_argument("--budget", type=float, default=180, help="seconds of tuning per setup")
    p.add_argument("--setups", default=",".join(SETUPS), help="which setups to tune (the others from --runs)")
    p.add_argument("--work", help="keep the setups' outputs and runs.json here (default: a temporary folder)")
    p.add_argument("--fleet-args", default="", help="more options of the fleet's command, e.g. '--clients 2'")
    p.add_argument("--runs", default="", help="runs.json files of setups tuned before (e.g. on another GPU)")
    p.add_argument("--alone-on", help="each model's GPU for the sequential setup, e.g. 2,2,3,3 (module doc)")
    p.add_argument("--cores-per-gpu", type=int, default=16, help="with --alone-on: GPU g gets cores g*N..g*N+N-1")
    p.add_argument("--tolerance", type=float, default=0.02, help="within this of the solo latency counts as reached")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--results", default=os.path.join("tunekit-out", "fleet-bench.md"), help="write the table here")
    args = p.parse_args(argv)
    setups = tuple(s for s in args.setups.split(",") if s)
    if not set(setups) <= {*SETUPS, *VARIANTS}:
        raise SystemExit(f"--setups: each of {', '.join((*SETUPS, *VARIANTS))}")
    with contextlib.ExitStack() as stack:
        work = args.work or stack.enter_context(tempfile.TemporaryDirectory(prefix="tunekit-fleet-bench-"))
        os.makedirs(work, exist_ok=True)
        if args.fleet:
            members = members_of(args.fleet)
        else:
            kind, pct = args.share[:3], int(args.share[3:])
            members = [Member(path, kind, pct, 1.0, f"m{i}")
                       for i, path in enumerate(make_models(args.models, image=args.image, work=work))]
        runs = {}
        for path in filter(None, args.runs.split(",")):
            with open(path) as fh:
                runs.update(json.load(fh))
        alone_on = [int(g) for g in args.alone_on.split(",")] if args.alone_on else None
        if alone_on is not None and len(alone_on) != len(members):
            raise SystemExit(f"--alone-on: one GPU per model ({len(members)})")
        runs.update(run_setups(members, budget=args.budget, work=work, setups=setups,
                               fleet_args=tuple(args.fleet_args.split()), alone_on=alone_on,
                               cores_per_gpu=args.cores_per_gpu))
        if "sequential" not in runs or len(runs) < 2:  # the table's ratios are to one after another
            print(f"tuned {', '.join(runs)}; the table needs sequential and another setup (--runs)", file=sys.stderr)
            return
        runs = {setup: runs[setup] for setup in (*SETUPS, *VARIANTS) if setup in runs}
        latency = bench_all(runs, members, rounds=args.rounds)
        text = table(members, runs, latency, tolerance=args.tolerance) + "\n\n" + \
            per_model_table(members, runs, tolerance=args.tolerance)
    write_results(text, args.results, script="fleet.py", argv=argv)


if __name__ == "__main__":
    main()
