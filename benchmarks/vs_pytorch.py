"""tunekit against what users already run: PyTorch eager, CUDA graphs and torch.compile (fp32 with
TF32, and fp16) and tunekit untuned / tuned at wall-clock budgets, at MPS shares, one machine.

Resumable across device calls of <= 10 minutes: every step appends to <results>/vs_pytorch.json and
skips what is already there; a tuning run continues with `tunekit tune --resume --time-budget`.

  python benchmarks/vs_pytorch.py export  --models resnet18,resnet50,mobilenet_v2,bert --work /tmp/vs
  python benchmarks/vs_pytorch.py pytorch --models resnet18 --pcts 40,100 --work /tmp/vs --results DIR
  python benchmarks/vs_pytorch.py untuned --models resnet18 --pcts 40,100 --work /tmp/vs --results DIR
  python benchmarks/vs_pytorch.py tune    --models resnet18 --pcts 40 --budgets 600,1800 --call-s 540 ...
  python benchmarks/vs_pytorch.py checkpoints --models resnet50 --from STUDYRES --results DIR
                                   # study_session.sh's `budgets` step (one process across device calls)
  python benchmarks/vs_pytorch.py table   --results DIR          # -> DIR/vs_pytorch.md

Models come from benchmarks/torch_models.py (random weights, seed 0; BERT-base at sequence 128).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))


def _load(path: str) -> dict:
    if os.path.isfile(path):
        with open(path) as fh:
            return json.load(fh)
    return {"models": {}}


def _save(state: dict, path: str) -> None:
    from tunekit.atomic import write_json_atomic

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json_atomic(path, state, indent=1)


def _onnx(work: str, model: str) -> str:
    return os.path.join(work, f"{model}.onnx")


class Bench:
    def __init__(self, args):
        self.args = args
        self.path = os.path.join(args.results, "vs_pytorch.json")
        self.state = _load(self.path)
        self.state.setdefault("machine", _machine())
        self.started = time.time()
        self.mps = None

    def model(self, name: str) -> dict:
        return self.state["models"].setdefault(name, {"pytorch": {}, "tunekit": {}})

    def save(self) -> None:
        _save(self.state, self.path)

    def time_left(self) -> float:
        return self.args.call_s - (time.time() - self.started)

    def enough_time(self, what: str, needs: float) -> bool:
        """Whether `needs` seconds are left of --call-s; if not, says what is skipped (a resumed call does it)."""
        if self.time_left() >= needs:
            return True
        print(f"{what}: skipped, {self.time_left():.0f} s left of --call-s {self.args.call_s:g} and it needs "
              f"{needs:.0f}; run the command again to go on", file=sys.stderr, flush=True)
        return False

    def pinned_env(self, pct: int) -> dict:
        """The environment of a process at `pct`% of the GPU, under this benchmark's MPS daemon."""
        from tunekit.shares.mps import MPSDaemon
        from tunekit.shares.pinning import pinned_env
        from tunekit.shares.share import Share

        if self.mps is None:
            self.mps = MPSDaemon().start()
            os.environ.update(self.mps.env())  # tunekit commands started from here reuse this daemon
        return {**os.environ, **pinned_env(Share("gpu", pct), mps_env=self.mps.env()).env}

    def close(self) -> None:
        if self.mps is not None:
            self.mps.stop()

    # ---------------------------------------------------------------- steps
    def export(self) -> None:
        os.makedirs(self.args.work, exist_ok=True)
        for name in self.args.models:
            if not os.path.isfile(_onnx(self.args.work, name)):
                _run([sys.executable, os.path.join(HERE, "torch_models.py"), "export", "--model", name, "--out",
                      _onnx(self.args.work, name)], timeout=600)

    def pytorch(self) -> None:
        for name in self.args.models:
            for pct in self.args.pcts:
                rows = self.model(name)["pytorch"].setdefault(f"gpu{pct}", {})
                todo = [v for v in self.args.variants if v not in rows
                        and (not v.startswith("compile") or pct in self.args.compile_pcts)]
                if not todo or not self.enough_time(f"pytorch {name} gpu{pct}", 60):
                    continue
                stdout = _run_partial([sys.executable, os.path.join(HERE, "torch_models.py"), "time", "--model",
                                       name, "--variants", ",".join(todo), "--repeats", str(self.args.repeats)],
                                      env=self.pinned_env(pct), timeout=max(60, self.time_left()))
                for line in stdout.splitlines():
                    if line.startswith("{"):
                        row = json.loads(line)
                        rows[row["variant"]] = row
                self.save()
                print(f"pytorch {name} gpu{pct}: {rows}", file=sys.stderr, flush=True)

    def untuned(self) -> None:
        """tunekit's untuned model (DLight, fp16 + NHWC + CUDA graphs on tensor-core GPUs) per share."""
        for name in self.args.models:
            entry = self.model(name)["tunekit"]
            pcts = [p for p in self.args.pcts if "untuned_ms" not in entry.get(f"gpu{p}", {})]
            if not pcts or not self.enough_time(f"untuned {name}", 90):
                continue
            self.pinned_env(pcts[0])  # the MPS daemon, reused by the command
            proc = _run([sys.executable, "-m", "tunekit.cli", "profile", _onnx(self.args.work, name), "--gpu-pct",
                         ",".join(map(str, pcts)), "--repeats", "100", "--json"], timeout=max(90, self.time_left()))
            for row in json.loads(proc.stdout)["shares"]:
                entry.setdefault(row["share"], {}).update(untuned_ms=row["median_ms"], sm_count=row.get("sm_count"))
            self.save()

    def tune(self) -> None:
        for name in self.args.models:
            for pct in self.args.pcts:
                self._tune_share(name, pct)

    def _tune_share(self, name: str, pct: int) -> None:
        entry = self.model(name)["tunekit"].setdefault(f"gpu{pct}", {})
        entry.setdefault("checkpoints", [])
        out = os.path.join(self.args.work, f"tune-{name}-gpu{pct}")
        while True:
            spent = entry.get("tuning_s", 0.0)
            due = [b for b in self.args.budgets if b > spent - 1 and not any(c["budget_s"] == b
                                                                                for c in entry["checkpoints"])]
            if not due or not self.enough_time(f"tune {name} gpu{pct}", self.args.startup_s + 60):
                return
            budget = min(due[0] - spent, self.time_left() - self.args.startup_s)
            self.pinned_env(pct)
            cmd = [sys.executable, "-m", "tunekit.cli", "tune", _onnx(self.args.work, name), "--gpu-pct", str(pct),
                   "--trials", "1000000", "--trials-per-iter", str(self.args.trials_per_iter), "--time-budget",
                   f"{max(30.0, budget):.0f}", "--out", out, "--json", *self.args.tune_flags]
            if os.path.isdir(os.path.join(out, f"records-gpu{pct}")):
                cmd.append("--resume")
            proc = _run(cmd, timeout=self.time_left() + 120, check=False)
            if proc.returncode != 0:
                print(proc.stderr[-3000:], file=sys.stderr)
                entry["error"] = proc.stderr.strip().splitlines()[-1][:400] if proc.stderr.strip() else "failed"
                self.save()
                return
            report = json.loads(proc.stdout)["report"]
            entry["tuning_s"] = spent + report["tuning_wall_s"]
            entry["trials"] = entry.get("trials", 0) + report["trials"]["measured"]
            entry["calls"] = entry.get("calls", 0) + 1
            entry.setdefault("untuned_ms", report["latency_ms"]["untuned"]["median_ms"])
            entry["last"] = _summary(report)
            if entry["tuning_s"] >= due[0] - 5 or report["trials"]["measured"] == 0:  # due, or nothing left
                entry["checkpoints"].append({"budget_s": due[0], **entry["last"], "tuning_s": entry["tuning_s"],
                                             "trials": entry["trials"]})
            self.save()
            with open(os.path.join(self.args.results, f"report-{name}-gpu{pct}.json"), "w") as fh:
                json.dump(report, fh, indent=1, default=str)


    def checkpoints(self) -> None:
        """The checkpoints of study_session.sh's `budgets` step (one process chain across device calls, each
        step a resumed tune of more seconds): report[-gpu<P>]-<seconds of tuning so far>.json per step. A run
        of several shares (one search measured at each) gives each share's column; the table says so."""
        import glob
        import re

        for name in self.args.models:
            run_dir = os.path.join(self.args.source, f"{name}-budgets")
            found: dict[str, dict[int, str]] = {}  # share label -> {seconds: report path}
            for path in glob.glob(os.path.join(run_dir, "report*-*.json")):
                match = re.fullmatch(r"report(?:-((?:gpu|cpu)\d+))?-(\d+)\.json", os.path.basename(path))
                if match:
                    found.setdefault(match.group(1) or "", {})[int(match.group(2))] = path
            several = len([label for label in found if label]) > 1
            for label, by_seconds in found.items():
                if several and not label:
                    continue  # the combined report of a several-share run: each share has its own
                trials = 0
                for seconds in sorted(by_seconds):
                    with open(by_seconds[seconds]) as fh:
                        report = json.load(fh)
                    share = label or report["share"]
                    entry = self.model(name)["tunekit"].setdefault(share, {})
                    trials += report["trials"]["measured"]
                    entry.setdefault("untuned_ms", report["latency_ms"]["untuned"]["median_ms"])
                    entry["checkpoints"] = [c for c in entry.get("checkpoints", []) if c["budget_s"] != seconds]
                    entry["checkpoints"].append({"budget_s": seconds, **_summary(report), "trials": trials,
                                                 **({"measured_with": report.get("measured_with")} if several else {})})
                    entry["checkpoints"].sort(key=lambda c: c["budget_s"])
            self.save()


def _summary(report: dict) -> dict:
    tasks = report["tasks"]
    return {"tuned_ms": report["latency_ms"]["tuned"]["median_ms"],
            "untuned_ms": report["latency_ms"]["untuned"]["median_ms"],
            "no_cuda_graph_ms": (report.get("latency_without_cuda_graph_ms") or {}).get("median_ms"),
            "precision": report.get("precision"), "artifact_choice": report.get("artifact_choice"),
            "tensor_cores": report.get("tensor_cores"), "numerics": report.get("numerics", {}).get("tuned"),
            "tasks_tuned": sum(1 for t in tasks if t.get("trials")), "tasks": len(tasks),
            "per_trial_s": report["tuning_wall_s"] / max(1, report["trials"]["measured"])}


def _run(cmd: list[str], *, timeout: float, env: dict | None = None, check: bool = True):
    print("$", " ".join(cmd[1:]), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return proc


def _run_partial(cmd: list[str], *, timeout: float, env: dict) -> str:
    """stdout of `cmd`, also what it printed before it ran out of time (one JSON line per variant)."""
    print("$", " ".join(cmd[1:]), file=sys.stderr, flush=True)
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env).stdout
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or b""
        return out.decode() if isinstance(out, bytes) else out


def _machine() -> str:
    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip()
    except OSError:
        gpu = "no GPU"
    return f"{_one_line(gpu)}; {os.cpu_count()} CPU cores; Python {platform.python_version()}"


def _one_line(gpus: str) -> str:
    """nvidia-smi's line per GPU as one line ("4 × NVIDIA H100 80GB HBM3, 580.159.04"): a table's
    Machine line must not break the markdown on a machine with several GPUs."""
    counts: dict[str, int] = {}
    for line in filter(None, (line.strip() for line in gpus.splitlines())):
        counts[line] = counts.get(line, 0) + 1
    return "; ".join(line if n == 1 else f"{n} × {line}" for line, n in counts.items())


def _machine_line(machine: str) -> str:
    """A results file's machine in one line; files written before _one_line hold a line per GPU, the
    last one followed by "; <cores>; <Python>"."""
    *gpus, last = machine.splitlines() or [""]
    name, _, rest = last.partition("; ")
    return "; ".join(filter(None, (_one_line("\n".join([*gpus, name])), rest)))


def _ms(value) -> str:
    return f"{value:.3f}" if value else "–"


_MODES = ("eager", "graphs", "compile", "maxautotune")
_HEADS = {"eager": "eager", "graphs": "graphs", "compile": "compile", "maxautotune": "max-autotune"}


def _variants(state: dict) -> list[str]:
    """The PyTorch variants measured for any model, fp32 (TF32) first, each mode in _MODES order."""
    seen = {v for entry in state["models"].values() for rows in entry["pytorch"].values() for v in rows}
    return [f"{mode}-{dtype}" for dtype in ("fp32", "fp16") for mode in _MODES if f"{mode}-{dtype}" in seen]


def _best_correct(rows: dict, variants: list[str]) -> float | None:
    """PyTorch's fastest variant whose output is within tunekit's fp16 bound: a wrong one is never the best."""
    return min((rows[v]["median_ms"] for v in variants
                if rows.get(v, {}).get("median_ms") and not _out_of_bound(rows[v])), default=None)


def table(state: dict) -> str:
    """One row per model and share: PyTorch's variants, tunekit untuned and at each budget, and tunekit's last time
    against PyTorch's fastest correct variant at that share and on the whole GPU (gpu100, where timed)."""
    variants = _variants(state)
    heads = [f"{_HEADS[v.split('-')[0]]} {v.split('-')[1]}{' (TF32)' if v.endswith('fp32') else ''}" for v in variants]
    lines = [f"Machine: {_machine_line(state.get('machine') or '')}", "",
             "| model | share | " + "".join(f"PyTorch {h} | " for h in heads) + "best correct PyTorch | tunekit "
             "untuned | tunekit tuned (budget: trials, ms) | tunekit / best correct PyTorch | / its best at 100% |",
             "|" + " --- |" * 2 + " ---: |" * (len(variants) + 5)]
    for name, entry in state["models"].items():
        whole = _best_correct(entry["pytorch"].get("gpu100", {}), variants)
        for share in sorted(set(entry["pytorch"]) | set(entry["tunekit"]), key=lambda s: int(s[3:])):
            rows = entry["pytorch"].get(share, {})
            cells = [rows.get(v, {}).get("median_ms") for v in variants]
            marks = ["†" if _out_of_bound(rows.get(v, {})) else "" for v in variants]
            best = _best_correct(rows, variants)
            mine = entry["tunekit"].get(share, {})
            tuned = "; ".join(f"{c['budget_s'] / 60:.0f} min: {c['trials']}, {c['tuned_ms']:.3f}"
                              for c in mine.get("checkpoints", []))
            joint = (mine.get("checkpoints") or [{}])[-1].get("measured_with")
            if joint:  # one search whose every candidate was measured at each of these shares
                tuned += f" (one search, measured at {'+'.join(joint)})"
            last = (mine.get("checkpoints") or [{}])[-1].get("tuned_ms") or mine.get("untuned_ms")
            ratio = f"{last / best:.3f}" if last and best else ""
            to_whole = f"{last / whole:.3f}" if last and whole else ""
            lines.append(f"| {name} | {share} | " + " | ".join(_ms(c) + m for c, m in zip(cells, marks))
                         + f" | {_ms(best)} | {_ms(mine.get('untuned_ms'))} | {tuned or '–'} | {ratio} | {to_whole} |")
    if any("†" in line for line in lines[2:]):
        bound = _fp16_bound()
        lines += ["", f"† PyTorch's output there is outside tunekit's fp16 bound (max rel error {bound.max_rel_err:g}, "
                  f"cosine {bound.min_cosine:g}) against the model in fp32 on the CPU: never PyTorch's best."]
    return "\n".join(lines + _error_lines(state)) + "\n"


def _fp16_bound():
    from tunekit.numerics import BOUNDS

    return BOUNDS["fp16"]


def _out_of_bound(row: dict) -> bool:
    """Whether a PyTorch variant's first output fails the bound tunekit's fp16 artifacts must meet."""
    if not row.get("errors"):
        return False
    err, bound = row["errors"][0], _fp16_bound()
    return not (err["max_rel_err"] <= bound.max_rel_err and err["cosine"] >= bound.min_cosine)


def _error_lines(state: dict) -> list[str]:
    """PyTorch's own error against the model in fp32 on the CPU, first output, measured as tunekit's
    numerics gate measures its artifacts (tunekit.numerics.BOUNDS["fp16"])."""
    rows = []
    for name, entry in state["models"].items():
        for share, variants in sorted(entry["pytorch"].items()):
            for variant, row in variants.items():
                if row.get("errors"):
                    err = row["errors"][0]
                    rows.append(f"| {name} | {share} | {variant} | {err['max_rel_err']:.3g} | {err['cosine']:.7f} |")
    if not rows:
        return []
    return ["", "PyTorch's own error (first output) against the same model in fp32 on the CPU:", "",
            "| model | share | variant | max rel error | cosine |", "| --- | --- | --- | ---: | ---: |", *rows]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=["export", "pytorch", "untuned", "tune", "checkpoints", "table", "all"])
    parser.add_argument("--models", default="resnet18,resnet50,mobilenet_v2,bert")
    parser.add_argument("--pcts", default="40,100")
    parser.add_argument("--variants", default="eager-fp32,graphs-fp32,compile-fp32,eager-fp16,graphs-fp16,compile-fp16")
    parser.add_argument("--budgets", default="600,1800", help="tuning checkpoints, seconds of tuning wall")
    parser.add_argument("--call-s", type=float, default=540, help="stop starting work after this many seconds")
    parser.add_argument("--startup-s", type=float, default=150, help="a tune command's time outside tuning")
    parser.add_argument("--trials-per-iter", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--compile-pcts", help="shares at which torch.compile is measured (default: all; each "
                        "costs a compile of 20-60 s)")
    parser.add_argument("--tune-flags", default="", help="more `tunekit tune` flags, space-separated")
    parser.add_argument("--work", default="/tmp/vs")
    parser.add_argument("--results", required=True)
    parser.add_argument("--from", dest="source", help="checkpoints: a study_session `budgets` result dir "
                        "(<model>-budgets/report[-gpu<P>]-<seconds>.json)")
    args = parser.parse_args(argv)
    args.models = [m for m in args.models.split(",") if m]
    args.pcts = [int(p) for p in args.pcts.split(",") if p]
    args.variants = [v for v in args.variants.split(",") if v]
    args.compile_pcts = [int(p) for p in args.compile_pcts.split(",")] if args.compile_pcts else args.pcts
    args.budgets = sorted(float(b) for b in args.budgets.split(",") if b)
    args.tune_flags = args.tune_flags.split()
    bench = Bench(args)
    try:
        steps = ["export", "pytorch", "untuned", "tune"] if args.step == "all" else [args.step]
        for step in steps:
            if step != "table":
                getattr(bench, step)()
    finally:
        bench.close()
        bench.save()
        with open(os.path.join(args.results, "vs_pytorch.md"), "w") as fh:
            fh.write(table(bench.state))
    print(table(bench.state))


if __name__ == "__main__":
    main()
