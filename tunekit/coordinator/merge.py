"""Merge the clients' database shards into the share's database.

Each shard is a MetaSchedule JSONDatabase (records.jsonl describes the two files). Workload
indices are local to a shard, so merging re-indexes them: a workload already in the share's
database (same structural hash: the key TVM's own lookup starts from) keeps its index. Merging is
idempotent (a record already present, same workload and same trace, is not added again), so it is
safe to repeat after a crash, and every shard line that is cut off is skipped, not fatal. The trace
keys a shard keeps beside its records (records.trace_keys) go along with them, so that the next run
on the share's database need not parse the merged records to key them.
"""
from __future__ import annotations

import fcntl
import json
import os

from ..records import kernel_records
from ..records.database import repair_truncated_tail
from ..records.jsonl import RECORDS, WORKLOADS, read_records, read_workloads
from ..records.trace_keys import append_keys, line_id, read_keys


def _append(path: str, rows: list) -> list[str]:
    """The rows appended as lines, fsynced; returns the lines as written."""
    lines = [json.dumps(row, separators=(",", ":")) for row in rows]
    if not lines:
        return lines
    with open(path, "a") as fh:
        fh.write("".join(line + "\n" for line in lines))
        fh.flush()
        os.fsync(fh.fileno())
    return lines


class _Merged:
    """The share's database as the merge sees it: workload hashes by index, records present."""

    def __init__(self, into: str):
        self.workloads = [w[0] if w else None for w in read_workloads(into)]
        self.index_of = {w: i for i, w in enumerate(self.workloads) if w is not None}
        self.present = {(self.workloads[r.workload], r.trace_text()) for r in read_records(into)
                        if r.workload < len(self.workloads)}
        self.new_workloads: list = []
        self.new_records: list = []
        self.new_keys: list = []  # the trace key of each new record, where its shard kept one

    def add(self, workload_line: list, record, trace_key: tuple | None) -> None:
        workload = workload_line[0]
        key = (workload, record.trace_text())
        if key in self.present:
            return
        self.present.add(key)
        if workload not in self.index_of:
            self.index_of[workload] = len(self.workloads)
            self.workloads.append(workload)
            self.new_workloads.append(workload_line)
        self.new_records.append([self.index_of[workload], record.record])
        self.new_keys.append(trace_key)


def merge_shards(shard_dirs: list[str], into: str) -> dict:
    """Append every shard's new records to the database in `into`. Returns counts."""
    os.makedirs(into, exist_ok=True)
    with open(os.path.join(into, ".merge.lock"), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in (WORKLOADS, RECORDS):
            repair_truncated_tail(os.path.join(into, name))
        merged, skipped = _Merged(into), 0
        for shard in shard_dirs:
            workloads, cut_off, keys = read_workloads(shard), [], read_keys(shard)
            for record in read_records(shard, skipped=cut_off):
                workload = workloads[record.workload] if record.workload < len(workloads) else None
                if workload is None:  # its workload line was cut off by a crash
                    skipped += 1
                    continue
                merged.add(workload, record, keys.get(line_id(record.text)))
            skipped += len(cut_off)
        _append(os.path.join(into, WORKLOADS), merged.new_workloads)
        lines = _append(os.path.join(into, RECORDS), merged.new_records)
        append_keys(into, [(line_id(text), *key) for text, key in zip(lines, merged.new_keys) if key is not None])
        kernels = kernel_records.copy_into(shard_dirs, into)
        fcntl.flock(lock, fcntl.LOCK_UN)
    return {"shards": len(shard_dirs), "new_records": len(merged.new_records),
            "new_workloads": len(merged.new_workloads), "new_kernel_records": kernels, "skipped_lines": skipped}

