"""Which tuned functions reach the compiled model: for a tune out dir, list per function whether
MetaScheduleApplyDatabase replaced it with a record, with the record's measured time.

  python benchmarks/apply_check.py MODEL.onnx OUT_DIR [SHARE]
"""
import sys

from tunekit.clients.compiler import apply_records
from tunekit.frontend.tasks import extract_tasks, prepare_for_tuning
from tunekit.records.database import find_share_databases, open_database, summarize
from tunekit.run.session import load_model
from tunekit.shares.share import Share
from tunekit.targets import target_for


def main():
    model, out = sys.argv[1], sys.argv[2]
    dbs = find_share_databases(out)
    label = sys.argv[3] if len(sys.argv) > 3 else next(iter(dbs))
    share = Share.from_label(label)
    target = target_for(share)
    prepared = prepare_for_tuning(load_model(model).mod, target)
    names = [t.task_name for t in extract_tasks(prepared, target)]
    db = open_database(dbs[label], create=False)
    summary = summarize(dbs[label])
    print("records:", summary["trials"], "trials,", summary["workloads"], "workloads")
    for w in summary["per_workload"]:
        print("  workload", w)
    applied = apply_records(prepared_mod=prepared, target=target, database=db)
    for gv, func in applied.functions.items():
        if gv.name_hint in names:
            scheduled = bool(func.attrs and func.attrs.get("tirx.is_scheduled", False))
            print(f"  {gv.name_hint:45s} scheduled_by_records={scheduled}")


if __name__ == "__main__":
    main()
