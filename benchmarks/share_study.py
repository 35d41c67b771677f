"""Issue 15's study, the evaluation half: every artifact of one build-once run, measured at every share.

After `tunekit tune M.onnx --gpu-pct 20,40,100 --robust --out W` (resumable: gpu_session.sh `study`),

  python benchmarks/share_study.py matrix --work W --kind gpu --pcts 20,40,60,100

measures `<model>-gpu<S>.so` (tuned at S) and `<model>-robust.so` at each share with `tunekit.bench`,
back to back in one process, and writes W/study_matrix.{json,md}: p50 latency per tuned-at x run-at,
the regret of each (latency / the best latency at that run-at share), and tuned-at-S against
tuned-at-100 at S. Per-task launch shapes (blocks x threads against the share's SMs) are in W/report.json
(`tasks_best_us[].launch`, written by the tune). `--kind cpu` does the same for CPU shares.
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
    return found


def measure(found: dict[str, str], kind: str, pcts: list[int], repeats: int) -> dict[str, dict[int, float]]:
    from tunekit.deploy import bench

    matrix: dict[str, dict[int, float]] = {}
    for pct in pcts:  # one share at a time, every artifact back to back: the same conditions for each
        for label, path in found.items():
            result = bench(path, repeats=repeats, **{f"{kind}_pct": pct})
            matrix.setdefault(label, {})[pct] = round(result.p50_ms, 4)
            print(f"{label} at {kind}{pct}: {result.p50_ms:.4f} ms", flush=True)
    return matrix


def summarize(matrix: dict[str, dict[int, float]], kind: str, pcts: list[int]) -> dict:
    best = {p: min(row[p] for row in matrix.values()) for p in pcts}
    regret = {label: {p: round(row[p] / best[p], 4) for p in pcts} for label, row in matrix.items()}
    full = f"{kind}100"
    at_share = {p: round(matrix[f"{kind}{p}"][p] / matrix[full][p], 4)
                for p in pcts if f"{kind}{p}" in matrix and full in matrix}
    return {"p50_ms": matrix, "regret": regret, "worst_regret": {k: max(v.values()) for k, v in regret.items()},
            "tuned_at_share_over_tuned_at_100": at_share}


def write(work: str, study: dict, kind: str, pcts: list[int]) -> str:
    head = "| tuned at | " + " | ".join(f"run at {kind}{p}" for p in pcts) + " | worst regret |"
    lines = ["p50 latency in ms (regret: latency / the best at that share)", "", head,
             "| --- |" + " ---: |" * (len(pcts) + 1)]
    for label, row in study["p50_ms"].items():
        cells = [f"{row[p]} ({study['regret'][label][p]})" for p in pcts]
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {study['worst_regret'][label]} |")
    lines += ["", "Tuned at the share / tuned at 100%, run at the share: "
              + ", ".join(f"{kind}{p}: {v}" for p, v in study["tuned_at_share_over_tuned_at_100"].items())]
    with open(os.path.join(work, "study_matrix.json"), "w") as fh:
        json.dump(study, fh, indent=1)
    text = "\n".join(lines) + "\n"
    with open(os.path.join(work, "study_matrix.md"), "w") as fh:
        fh.write(text)
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    m = sub.add_parser("matrix")
    m.add_argument("--work", required=True)
    m.add_argument("--kind", choices=("gpu", "cpu"), default="gpu")
    m.add_argument("--pcts", default="20,40,60,100")
    m.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args(argv)
    pcts = [int(p) for p in args.pcts.split(",")]
    found = artifacts(args.work, args.kind)
    if not found:
        print(f"no tuned artifacts in {args.work}", file=sys.stderr)
        return 2
    study = summarize(measure(found, args.kind, pcts, args.repeats), args.kind, pcts)
    print(write(args.work, study, args.kind, pcts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
