"""A share's database holding only some workloads of another: a fleet's records, handed to each model.

The fleet searches every model's tasks into one database (run.fleet); each model's own records dir gets the
records of its workloads, written as a single run writes them (workloads, records, their trace keys), so that
`tunekit compile`, `--resume` and a warm start read a model's dir without knowing it was tuned in a fleet.
"""
from __future__ import annotations

import json
import os

from . import kernel_records, trace_keys
from .baselines import key_of_hash
from .jsonl import RECORDS, WORKLOADS, read_records, read_workloads


def write_subset(src_dir: str, dst_dir: str, keys: set[str]) -> int:
    """Replace `dst_dir`'s workloads and records with `src_dir`'s of the workloads in `keys`
    (records.baselines.workload_key); returns how many records it holds. Each file is replaced whole
    (a crash leaves the old one or the new one), the records before their keys."""
    rows = read_workloads(src_dir)
    index = {}  # src workload index -> dst index
    workloads = []
    for i, row in enumerate(rows):
        if row is not None and key_of_hash(row[0]) in keys:
            index[i] = len(workloads)
            workloads.append(json.dumps(row))
    known = trace_keys.read_keys(src_dir)
    records, kept_keys = [], []
    for line in read_records(src_dir):
        if line.workload in index:
            text = json.dumps([index[line.workload], line.record])
            records.append(text)
            if trace_keys.line_id(line.text) in known:
                kept_keys.append((trace_keys.line_id(text), *known[trace_keys.line_id(line.text)]))
    os.makedirs(dst_dir, exist_ok=True)
    _replace(os.path.join(dst_dir, WORKLOADS), workloads)
    _replace(os.path.join(dst_dir, RECORDS), records)
    _replace(os.path.join(dst_dir, trace_keys.KEYS), [])
    trace_keys.append_keys(dst_dir, kept_keys)
    kernel_records.copy_into([src_dir], dst_dir, keys=keys)  # its tasks' kernels of another kind, as measured
    return len(records)


def _replace(path: str, lines: list[str]) -> None:
    with open(path + ".tmp", "w") as fh:
        fh.write("".join(line + "\n" for line in lines))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(path + ".tmp", path)
