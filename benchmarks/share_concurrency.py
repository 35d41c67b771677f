"""What measuring at several shares of one device at once does to the timings (issue 54: may a fleet whose shares fit
on the GPU together measure them side by side, or must they take turns under the measurement lock?).

Each artifact is timed at its own share alone, the others idle (what the lock gives), and all of them at once, each
at its own share (`tunekit.deploy.bench`, one process pinned to its share each), in alternating rounds. Per artifact
and round: the side-by-side p50 over the alone p50 of the same round. Printed and written (`--results`): per artifact
the median ratio, and over every artifact and round the deviation |ratio - 1| (median, p90), with each setting's
spread (p90 / p50). The side-by-side windows start together to within a process start (a second or two): `--repeats`
keeps each window much longer than that.

  python benchmarks/share_concurrency.py --kind gpu --artifacts a.so:20,b.so:30,c.so:20,d.so:30 --rounds 5
  python benchmarks/share_concurrency.py --kind cpu --onnx m1.onnx:50,m2.onnx:50   # tunes each briefly first
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from tuning_time import write_results  # noqa: E402  (the same machine line as every benchmark)


def parse_pairs(text: str) -> list[tuple[str, int]]:
    """`path:pct,...` -> [(path, pct)]."""
    pairs = []
    for item in text.split(","):
        path, _, pct = item.rpartition(":")
        if not path or not pct.isdigit() or not 1 <= int(pct) <= 100:
            raise SystemExit(f"not PATH:PCT (PCT in 1..100): {item!r}")
        pairs.append((path, int(pct)))
    return pairs


def tuned_artifacts(models: list[tuple[str, int]], *, kind: str, trials: int, work: str) -> list[tuple[str, int]]:
    """Each ONNX model tuned briefly at its share (`tunekit tune --trials N`): its artifact."""
    out = []
    for i, (model, pct) in enumerate(models):
        cmd = [sys.executable, "-m", "tunekit.cli", "tune", model, f"--{kind}-pct", str(pct), "--trials", str(trials),
               "--out", os.path.join(work, f"m{i}"), "--json"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"tunekit tune {model} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        out.append((json.loads(proc.stdout)["artifact"], pct))
    return out


def time_at(artifact: str, pct: int, *, kind: str, repeats: int) -> tuple[float, float]:
    """(p50 ms, p90 ms) of `artifact` at its share."""
    from tunekit.deploy import bench

    shares = {"gpu_pct": pct} if kind == "gpu" else {"cpu_pct": pct}
    result = bench(artifact, repeats=repeats, warmup=max(10, repeats // 20), **shares)
    return result.p50_ms, result.p90_ms


def rounds(artifacts: list[tuple[str, int]], *, kind: str, repeats: int, count: int, on_round=None) -> list[dict]:
    """Per round: {"alone": [(p50, p90) per artifact], "together": [...]}, the order of the two alternating;
    `on_round(rounds so far)` after each (a run cut short keeps its table)."""
    out = []
    for r in range(count):
        row = {}
        for setting in (("alone", "together") if r % 2 == 0 else ("together", "alone")):
            if setting == "alone":
                row[setting] = [time_at(a, p, kind=kind, repeats=repeats) for a, p in artifacts]
            else:
                with ThreadPoolExecutor(len(artifacts)) as pool:
                    row[setting] = list(pool.map(lambda ap: time_at(ap[0], ap[1], kind=kind, repeats=repeats),
                                                 artifacts))
        out.append(row)
        if on_round is not None:
            on_round(out)
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def table(artifacts: list[tuple[str, int]], measured: list[dict]) -> str:
    lines = ["| artifact | share | alone p50 ms | side by side p50 ms | side by side / alone (median) |",
             "| --- | ---: | ---: | ---: | ---: |"]
    deviations, spread = [], {"alone": [], "together": []}
    for i, (artifact, pct) in enumerate(artifacts):
        alone = [row["alone"][i][0] for row in measured]
        together = [row["together"][i][0] for row in measured]
        ratios = [t / a for t, a in zip(together, alone)]
        deviations += [abs(r - 1) for r in ratios]
        for setting in spread:
            spread[setting] += [row[setting][i][1] / row[setting][i][0] for row in measured]
        lines.append(f"| {os.path.basename(artifact)} | {pct}% | {statistics.median(alone):.4f} | "
                     f"{statistics.median(together):.4f} | {statistics.median(ratios):.3f} |")
    lines += ["", f"deviation of side-by-side timing from alone, over {len(deviations)} artifact-rounds: median "
                  f"{statistics.median(deviations):.3f}, p90 {percentile(deviations, 0.9):.3f}",
              f"spread p90/p50: alone median {statistics.median(spread['alone']):.3f}, side by side median "
              f"{statistics.median(spread['together']):.3f}"]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kind", choices=("gpu", "cpu"), default="gpu")
    given = p.add_mutually_exclusive_group(required=True)
    given.add_argument("--artifacts", help="compiled models and their shares: a.so:20,b.so:30")
    given.add_argument("--onnx", help="ONNX models and their shares, tuned briefly first: a.onnx:50,b.onnx:50")
    p.add_argument("--trials", type=int, default=16, help="with --onnx: trials per model")
    p.add_argument("--repeats", type=int, default=2000, help="runs per timing window")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--results", default=os.path.join("tunekit-out", "share-concurrency.md"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="tunekit-share-concurrency-") as work:
        artifacts = (parse_pairs(args.artifacts) if args.artifacts else
                     tuned_artifacts(parse_pairs(args.onnx), kind=args.kind, trials=args.trials, work=work))
        if sum(pct for _, pct in artifacts) > 100:
            raise SystemExit("the shares sum past 100%: side by side they would not fit on the device")
        rounds(artifacts, kind=args.kind, repeats=args.repeats, count=args.rounds,
               on_round=lambda done: write_results(table(artifacts, done), args.results,
                                                   script="share_concurrency.py", argv=argv))


if __name__ == "__main__":
    main()
