"""Merge the clients' database shards into the share's database.

Each shard is a MetaSchedule JSONDatabase: a workload file (one line per workload: [structural
hash, serialized module]) and a record file (one line per trial: [workload index, record]).
Workload indices are local to a shard, so merging re-indexes them: a workload already in the
share's database (same structural hash: the key TVM's own lookup starts from) keeps its index. Merging is idempotent (a record
already present, same workload and same trace, is not added again), so it is safe to repeat
after a crash, and every shard line that is cut off is skipped, not fatal.
"""
from __future__ import annotations

import fcntl
import json
import os

from ..records.database import RECORDS, WORKLOADS, repair_truncated_tail


def _lines(path: str) -> list[str]:
    if not os.path.isfile(path):
        return []
    with open(path) as fh:
        return [line.rstrip("\n") for line in fh if line.strip()]


def _record_key(workload_key: tuple, record_line: str) -> tuple | None:
    try:
        _index, record = json.loads(record_line)
    except ValueError:
        return None
    return workload_key, json.dumps(record[0], sort_keys=True)


def merge_shards(shard_dirs: list[str], into: str) -> dict:
    """Append every shard's new records to the database in `into`. Returns counts."""
    os.makedirs(into, exist_ok=True)
    with open(os.path.join(into, ".merge.lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in (WORKLOADS, RECORDS):
            repair_truncated_tail(os.path.join(into, name))
        workloads = [json.loads(line)[0] for line in _lines(os.path.join(into, WORKLOADS))]
        index_of = {w: i for i, w in enumerate(workloads)}
        present = set()
        for line in _lines(os.path.join(into, RECORDS)):
            try:
                index = json.loads(line)[0]
            except ValueError:
                continue
            key = _record_key(workloads[index], line) if index < len(workloads) else None
            if key:
                present.add(key)
        new_workloads, new_records, skipped = [], [], 0
        for shard in shard_dirs:
            shard_workloads = []
            for line in _lines(os.path.join(shard, WORKLOADS)):
                try:
                    shard_workloads.append(json.loads(line))
                except ValueError:
                    shard_workloads.append(None)  # cut off by a crash: its records are skipped
            for line in _lines(os.path.join(shard, RECORDS)):
                try:
                    index, record = json.loads(line)
                    workload = shard_workloads[index]
                except (ValueError, IndexError, TypeError):
                    skipped += 1
                    continue
                if workload is None:
                    skipped += 1
                    continue
                workload, workload_line = workload[0], workload
                key = (workload, json.dumps(record[0], sort_keys=True))
                if key in present:
                    continue
                present.add(key)
                if workload not in index_of:
                    index_of[workload] = len(workloads)
                    workloads.append(workload)
                    new_workloads.append(workload_line)
                new_records.append([index_of[workload], record])
        for name, rows in ((WORKLOADS, new_workloads), (RECORDS, new_records)):
            if not rows:
                continue
            with open(os.path.join(into, name), "a") as fh:
                for row in rows:
                    fh.write(json.dumps(row, separators=(",", ":")) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
        fcntl.flock(lock, fcntl.LOCK_UN)
    return {"shards": len(shard_dirs), "new_records": len(new_records), "new_workloads": len(new_workloads),
            "skipped_lines": skipped}
