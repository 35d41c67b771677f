"""How long a resumed run takes to open a share's records before its search can start, side by side:

  whole      TVM's JSONDatabase of the whole dir (every trace parsed), and every record's trace key
             computed from it: what tunekit did before records.tuning_database
  first      records.tuning_database.open_for_tuning on records without their keys (an older run's):
             each record parsed alone to key it, once, and the keys kept
  resumed    open_for_tuning on records with their keys (a run of this tunekit resumed): only each
             workload's best `--seeds` records are parsed

  python benchmarks/resume_open.py --records DIR [--seeds 26] [--results FILE.md]

Each case runs in a fresh process on a fresh copy of DIR, one after the other on the same machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

_CASE = r"""
import json, sys, time
t0 = time.perf_counter()
from tunekit.metaschedule_env import import_for_target
for kind in ("cuda", "llvm"):
    import_for_target(kind)  # the records' intrinsics: registered before the clock, as a tuning run has them
t1 = time.perf_counter()
case, path, seeds = sys.argv[1], sys.argv[2], int(sys.argv[3])
if case == "whole":
    from tunekit.records.database import open_database
    from tunekit.records.tuning_database import known_traces
    database = open_database(path)
    known = known_traces(database)
else:
    from tunekit.records.tuning_database import known_traces, open_for_tuning
    database = open_for_tuning(path, seeds=seeds)
    known = known_traces(database)
t2 = time.perf_counter()
print(json.dumps({"open_s": t2 - t1, "keys": sum(len(v) for v in known.values()), "workloads": len(known)}))
"""


def _copy(src: str, dst: str, *, keys: bool) -> None:
    os.makedirs(dst)
    for name in ("database_workload.json", "database_tuning_record.json") + (("tunekit-trace-keys.jsonl",) if keys else ()):
        shutil.copyfile(os.path.join(src, name), os.path.join(dst, name))


def _run(case: str, path: str, seeds: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", _CASE, case, path, str(seeds)], capture_output=True, text=True,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    if proc.returncode != 0:
        raise SystemExit(f"{case}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--records", required=True, help="a share's database dir (records-<share>)")
    p.add_argument("--seeds", type=int, default=26, help="best records kept per workload (tunekit's CUDA default: "
                   "ceil(population 128 x 0.2) = 26)")
    p.add_argument("--results", help="write the table here (markdown) and beside it as .json")
    args = p.parse_args()
    from tunekit.records.jsonl import count_records

    lines = count_records(args.records)
    work = tempfile.mkdtemp(prefix="resume-open-")
    rows = {}
    _copy(args.records, os.path.join(work, "whole"), keys=False)
    rows["whole"] = _run("whole", os.path.join(work, "whole"), args.seeds)
    _copy(args.records, os.path.join(work, "first"), keys=False)
    rows["first"] = _run("first", os.path.join(work, "first"), args.seeds)
    # the first open kept the keys: resuming a run of this tunekit
    rows["resumed"] = _run("resumed", os.path.join(work, "first"), args.seeds)
    shutil.rmtree(work, ignore_errors=True)
    if len({row["keys"] for row in rows.values()}) != 1:
        raise SystemExit(f"the cases found different records: {rows}")
    base = rows["whole"]["open_s"]
    table = [f"Records: `{args.records}`: {lines} record lines, {rows['whole']['workloads']} workloads, "
             f"{rows['whole']['keys']} distinct candidates. Best records kept per workload: {args.seeds}.",
             "", f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
             f"Python {platform.python_version()}", "",
             f"Command: `python benchmarks/resume_open.py --records {args.records} --seeds {args.seeds}`", "",
             "| open | seconds | whole / this |", "| --- | ---: | ---: |"]
    names = {"whole": "TVM's whole JSONDatabase + every key (before)",
             "first": "open_for_tuning, no keys kept yet (each record parsed alone, once)",
             "resumed": "open_for_tuning, keys kept (a resumed run of this tunekit)"}
    for case, row in rows.items():
        table.append(f"| {names[case]} | {row['open_s']:.1f} | {base / row['open_s']:.2f}x |")
    text = "\n".join(table) + "\n"
    print(text)
    if args.results:
        with open(args.results, "w") as fh:
            fh.write(text)
        with open(os.path.splitext(args.results)[0] + ".json", "w") as fh:
            json.dump({"records": args.records, "lines": lines, "seeds": args.seeds, "cases": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
