"""The only reader of MetaSchedule's JSON-lines database files (everything else goes through TVM's
JSONDatabase or through this module).

A database dir holds two files:
- `database_workload.json`: one line per workload, `[structural hash, serialized module]`;
- `database_tuning_record.json`: one line per trial, `[workload index, [trace, run_secs, target,
  args_info]]` (the index points into the workload file, 0-based).
A line that does not parse (the last one, cut off by a crash; or one being written right now)
is skipped, never fatal: every complete line before it is still read.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Iterator

WORKLOADS = "database_workload.json"
RECORDS = "database_tuning_record.json"


@dataclass
class RecordLine:
    workload: int      # index into the workload file
    record: list       # [trace, run_secs, target, args_info]
    text: str          # the line as it is in the file

    @property
    def trace(self):
        return self.record[0]

    @property
    def run_secs(self) -> list:
        return self.record[1]

    def trace_text(self) -> str:
        """The trace as a canonical string: the identity of a candidate within its workload."""
        return json.dumps(self.record[0], sort_keys=True)


def _lines(path: str) -> Iterator[str]:
    if not os.path.isfile(path):
        return
    with open(path) as fh:
        for line in fh:
            if line.strip():
                yield line.rstrip("\n")


def read_workloads(db_dir: str) -> list:
    """Every workload line, in file order: [hash, module] each, or None for a line that is cut off
    (its records are then unusable, but the indices of the lines after it stay right)."""
    rows = []
    for line in _lines(os.path.join(db_dir, WORKLOADS)):
        try:
            rows.append(json.loads(line))
        except ValueError:
            rows.append(None)
    return rows


def read_records(db_dir: str, *, skipped: list | None = None) -> Iterator[RecordLine]:
    """Every complete trial line, in file order. Lines that do not parse are appended to `skipped`."""
    for line in _lines(os.path.join(db_dir, RECORDS)):
        try:
            index, record = json.loads(line)
            if not isinstance(index, int) or not isinstance(record, list) or len(record) < 2:
                raise ValueError(line)
        except (ValueError, TypeError):
            if skipped is not None:
                skipped.append(line)
            continue
        yield RecordLine(index, record, line)


def record_keys(db_dir: str) -> list[tuple]:
    """(workload hash, trace) of every trial: one per candidate if nothing was measured twice."""
    workloads = read_workloads(db_dir)
    return [(workloads[r.workload][0] if r.workload < len(workloads) and workloads[r.workload] else None,
             r.trace_text()) for r in read_records(db_dir)]


def count_records(db_dir: str) -> int:
    return sum(1 for _ in read_records(db_dir))
