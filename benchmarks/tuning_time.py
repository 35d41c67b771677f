"""Tuning time: stock MetaSchedule vs tunekit, same model, trials, seed and share, in one run.

Each engine runs as its own `tunekit tune` process (so each pays its own imports and start-up):
- stock:   `--engine stock`: ms.tune_tasks + LocalBuilder + RPCRunner, measuring on TVM's own
           rpc_server at the share (--no-fork on GPU: fork mode breaks CUDA);
- tunekit: the defaults (persistent build pool, warm servers, persistent sessions, overlapped loop).

- before:  tunekit's defaults run from another source tree (--before-src DIR, a checkout or a
           `git archive` of an earlier commit holding tunekit/): a change measured against the code
           before it, in the same run (PYTHONPATH puts DIR first, for its servers and workers too).

Prints one Markdown table (wall time, trials/s, seconds per trial by phase, final latency at the
share, and each run's ratio to tunekit) and where each whole command's time went (report.json's
`command_s`), and writes them, with the machine and command, to --results.

  python benchmarks/tuning_time.py --model tiny_cnn --cpu-pct 50 --trials 32
  python benchmarks/tuning_time.py --model resnet18 --gpu-pct 40 --trials 64
  git archive HEAD~3 tunekit | tar -x -C /tmp/before
  python benchmarks/tuning_time.py --model resnet18 --cpu-pct 50 --engines before,tunekit,stock --before-src /tmp/before
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

ENGINES = {"stock": ["--engine", "stock"], "tunekit": [], "before": []}


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            cpu = next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    text = f"{cpu}, {os.cpu_count()} cores, Python {platform.python_version()}"
    try:
        import pynvml

        pynvml.nvmlInit()
        text += f", GPU: {pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))}"
    except Exception:
        text += ", no GPU"
    return text


def write_results(text: str, path: str, *, script: str, argv: list[str] | None) -> None:
    """Print `text` with the machine and the command that made it, and write the same to `path`."""
    command = f"python benchmarks/{script} " + " ".join(argv if argv is not None else sys.argv[1:])
    report = f"{text}\n\nmachine: {machine()}\ncommand: `{command}`\n"
    print(report)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        fh.write(report)


def model_path(name: str, workdir: str) -> str:
    if os.path.isfile(name):
        return name
    from tunekit.models.examples import save_example

    return save_example(name, os.path.join(workdir, f"{name}.onnx"))


def run_engine(engine: str, model: str, share_flag: list[str], args, workdir: str) -> dict:
    out = os.path.join(workdir, engine)
    cmd = [sys.executable, "-m", "tunekit.cli", "tune", model, *share_flag, "--trials", str(args.trials),
           "--trials-per-iter", str(args.trials_per_iter), "--seed", str(args.seed), "--out", out, "--json",
           *ENGINES[engine], *args.extra]
    env, cwd = dict(os.environ), None
    if engine == "before":
        # `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH: the before tree
        # must be both, or the checkout's own tunekit runs (and its servers and workers inherit both)
        cwd = os.path.abspath(args.before_src)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, env.get("PYTHONPATH")) if p)
    print(f"[{engine}] {' '.join(cmd[2:])}", file=sys.stderr, flush=True)
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    if proc.returncode != 0:
        sys.exit(f"{engine} failed:\n{proc.stderr[-3000:]}")
    report = json.loads(proc.stdout)["report"]
    report["process_wall_s"] = round(time.time() - started, 1)
    report["source"] = cwd or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # which tunekit ran
    return report


def table(reports: dict) -> str:
    fast = reports.get("tunekit")
    runs = list(reports)
    rows = [("tuning wall time (s)", lambda r: r["tuning_wall_s"], "{:.1f}"),
            ("whole command (s)", lambda r: r["process_wall_s"], "{:.1f}"),
            ("trials measured", lambda r: r["trials"]["measured"], "{}"),
            ("failed trials", lambda r: r["trials"]["failed"], "{}"),
            ("trials / s", lambda r: r["trials"]["measured"] / r["tuning_wall_s"], "{:.3f}"),
            ("s / trial", lambda r: r["tuning_wall_s"] / max(1, r["trials"]["measured"]), "{:.3f}"),
            ("untuned latency (ms)", lambda r: r["latency_ms"]["untuned"]["median_ms"], "{:.4f}"),
            ("tuned latency (ms)", lambda r: r["latency_ms"]["tuned"]["median_ms"], "{:.4f}")]
    others = [r for r in runs if r != "tunekit"] if fast else []
    lines = ["| metric | " + " | ".join(runs) + " | " + " | ".join(f"{r} / tunekit" for r in others) + " |",
             "| --- |" + " ---: |" * (len(runs) + len(others))]
    for label, get, fmt in rows:
        values = {r: get(reports[r]) for r in runs}
        cells = [fmt.format(values[r]) if values[r] is not None else "" for r in runs]
        cells += [f"{values[r] / values['tunekit']:.2f}" if values[r] is not None and values["tunekit"] else ""
                  for r in others]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    steps = sorted({k for r in runs for k in reports[r].get("command_s", {})}, key=_step_rank)
    if steps:
        lines += ["", "Where each whole command went (report.json `command_s`, seconds; `tune_s` holds the tuning "
                  "wall, and the rest of the command is its process start and exit):", "",
                  "| run | " + " | ".join(steps) + " | rest |", "| --- |" + " ---: |" * (len(steps) + 1)]
        for r in runs:
            got = reports[r].get("command_s", {})
            counted = sum(v for k, v in got.items() if k not in ("tuning_wall_s",))
            lines.append(f"| {r} | " + " | ".join(f"{got[k]:.1f}" if k in got else "" for k in steps)
                         + f" | {reports[r]['process_wall_s'] - counted:.1f} |")
    if fast and fast.get("phases", {}).get("per_trial_s"):
        per = fast["phases"]["per_trial_s"]
        lines += ["", "tunekit seconds per trial by phase (search is the loop's thread; build is the stage thread, "
                  "overlapping search; load and run are summed over candidates on the servers; wait is the loop "
                  "blocked on a batch's build or measurements):", "",
                  "| " + " | ".join(per) + " | overhead fraction |",
                  "|" + " ---: |" * (len(per) + 1),
                  "| " + " | ".join(f"{v:.4f}" for v in per.values()) + f" | {fast['phases']['overhead_fraction']} |"]
    return "\n".join(lines)


_STEP_ORDER = ["load_s", "prepare_s", "connect_s", "session_s", "untuned_s", "tune_s", "tuning_wall_s", "finish_s",
               "robust_s", "robust_compile_s"]


def _step_rank(step: str) -> int:
    return _STEP_ORDER.index(step) if step in _STEP_ORDER else len(_STEP_ORDER)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny_cnn", help="an example name or an ONNX path")
    parser.add_argument("--cpu-pct", type=int)
    parser.add_argument("--gpu-pct", type=int)
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--trials-per-iter", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--engines", default="tunekit,stock", help=f"runs, in order, of {', '.join(ENGINES)}")
    parser.add_argument("--before-src", help="the `before` run's source tree (a folder holding tunekit/)")
    parser.add_argument("--results", help="write the table here (Markdown)")
    parser.add_argument("extra", nargs="*", help="more `tunekit tune` flags for both engines (after --)")
    args = parser.parse_args()
    share_flag = ["--gpu-pct", str(args.gpu_pct)] if args.gpu_pct else ["--cpu-pct", str(args.cpu_pct or 50)]
    unknown = [e for e in args.engines.split(",") if e not in ENGINES]
    if unknown:
        parser.error(f"unknown engine(s) {', '.join(unknown)}: choose from {', '.join(ENGINES)}")
    if "before" in args.engines.split(",") and not (args.before_src and os.path.isdir(os.path.join(args.before_src,
                                                                                                    "tunekit"))):
        parser.error("the `before` run needs --before-src DIR, a folder holding tunekit/")
    with tempfile.TemporaryDirectory(prefix="tunekit-bench-") as workdir:
        model = os.path.abspath(model_path(args.model, workdir))
        reports = {}
        for engine in args.engines.split(","):
            reports[engine] = run_engine(engine, model, share_flag, args, workdir)
            if args.results:  # each engine's report as soon as it exists: a cut-off run keeps it
                os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
                with open(os.path.splitext(args.results)[0] + ".json", "w") as fh:
                    json.dump(reports, fh, indent=1, default=str)
    text = (f"# Tuning time: {args.model} at {share_flag[0][2:]} {share_flag[1]}%, {args.trials} trials, "
            f"seed {args.seed}\n\nMachine: {machine()}\n\nCommand: `python benchmarks/tuning_time.py "
            f"{' '.join(sys.argv[1:])}`\n\n{table(reports)}\n")
    print(text)
    if args.results:
        os.makedirs(os.path.dirname(os.path.abspath(args.results)), exist_ok=True)
        with open(args.results, "w") as fh:
            fh.write(text)
        with open(os.path.splitext(args.results)[0] + ".json", "w") as fh:
            json.dump(reports, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
