"""Warm start: begin a share's search from records tuned elsewhere, measured again at this share.

Sources are tune out dirs or record dirs (`--warm-start DIR`, repeatable): another share of the same
model, an earlier run, or another model with some of the same workloads (matched by structural
equality, as TVM's own database lookup does). A foreign record never enters this share's database
as it is: its timing was taken at another share (or on another device). Its candidate is built and
measured again here, and only that measurement is recorded; the evolutionary search then seeds
itself from the database's best, which now hold these re-measured candidates.
"""
from __future__ import annotations

import logging

from ..records.database import find_share_databases, mean_run_us, open_database

log = logging.getLogger("tunekit.warm_start")


def open_sources(dirs: list[str]) -> list:
    """Every share database under the given dirs, opened read-only."""
    databases = []
    for directory in dirs:
        for path in find_share_databases(directory).values():
            databases.append(open_database(path, read_only=True))
    return databases


def best_records(databases: list) -> dict:
    """{workload module: [TuningRecord, ...] fastest first}, over every source (failed ones dropped)."""
    import tvm_ffi

    groups: list[tuple] = []  # (mod, records): few workloads, so a linear search by structural equality
    for database in databases:
        for record in database.get_all_tuning_records():
            if mean_run_us(record.run_secs) is None:
                continue
            mod = record.workload.mod
            group = next((g for m, g in groups if tvm_ffi.structural_equal(m, mod)), None)
            if group is None:
                groups.append((mod, [record]))
            else:
                group.append(record)
    return {mod: sorted(records, key=lambda r: mean_run_us(r.run_secs)) for mod, records in groups}


# Per task, the foreign records measured again here: each costs a trial of this run.
TOP_K = 2


def pick(tasks: list, foreign: dict, *, top_k: int = TOP_K, trace_key) -> list[tuple]:
    """(task, record) pairs to measure again: each task's `top_k` fastest foreign records whose
    candidate this share has not measured yet (one per distinct trace)."""
    import tvm_ffi

    chosen = []
    for task in tasks:
        records = next((r for mod, r in foreign.items() if tvm_ffi.structural_equal(mod, task.ctx.mod)), [])
        keys = set(task.seen)
        for record in records:
            if len([c for c in chosen if c[0] is task]) >= top_k:
                break
            key = trace_key(record.trace)
            if key in keys:
                continue
            keys.add(key)
            chosen.append((task, record))
    return chosen
