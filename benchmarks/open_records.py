"""What reading a share's records costs when compiling a model: TVM's JSONDatabase against open_best_records.

Compiling a tuned model needs one record per workload (its best), yet opening the share's JSONDatabase parses every
trial's trace. This times both on the same records dir, rounds alternating, after the target's tensor intrinsics
are imported (a tuning process has them already), and checks that both rank the same record first.

  python benchmarks/open_records.py RECORDS_DIR [--rounds 3] [--target-kind cuda]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("records", help="a records-<share> dir (database_workload.json, database_tuning_record.json)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--target-kind", default="cuda", help="whose tensor intrinsics to import first")
    args = parser.parse_args(argv)

    from tunekit.metaschedule_env import import_for_target
    from tunekit.records.baselines import workload_key
    from tunekit.records.database import open_best_records, open_database
    from tunekit.records.jsonl import count_records

    import_for_target(args.target_kind)
    size = sum(os.path.getsize(os.path.join(args.records, f)) for f in os.listdir(args.records)
               if f.startswith("database_"))
    times = {"JSONDatabase (open_database)": [], "open_best_records": []}
    for _ in range(args.rounds):
        for name, opener in (("JSONDatabase (open_database)", open_database), ("open_best_records", open_best_records)):
            started = time.perf_counter()
            database = opener(args.records)
            times[name].append(time.perf_counter() - started)
            if name == "open_best_records":
                best = database
            else:
                full = database
    workloads = {}
    for record in full.get_all_tuning_records():
        workloads.setdefault(workload_key(record.workload.mod), record.workload)
    same = sum(str(full.get_top_k(w, 1)[0].trace if full.get_top_k(w, 1) else None)
               == str(best.get_top_k(best.commit_workload(w.mod), 1)[0].trace if best.get_top_k(best.commit_workload(w.mod), 1) else None)
               for w in workloads.values())
    print(f"{args.records}: {count_records(args.records)} records, {len(workloads)} workloads, {size / 1e6:.1f} MB; "
          f"best record the same for {same} of {len(workloads)} workloads\n")
    print("| reader | seconds per open (rounds) | median |\n| --- | --- | ---: |")
    for name, values in times.items():
        print(f"| {name} | {', '.join(f'{v:.2f}' for v in values)} | {sorted(values)[len(values) // 2]:.2f} |")
    base, new = (sorted(v)[len(v) // 2] for v in times.values())
    print(f"\nratio: {base / new:.1f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
