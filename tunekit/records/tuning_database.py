"""The database a tuning run appends to, opened without parsing every trial already in it.

TVM's JSONDatabase parses every record's trace when it opens, minutes for a resumed share's records
(benchmarks/RESULTS.md, "resume open"). A run needs much less of them:
- the search seeds each workload's population with its best measured records (EvolutionarySearch's
  PickBestFromDatabase: population x init_measured_ratio of them, through get_top_k);
- the loop needs every record's trace key, so that nothing is measured twice (records.trace_keys keeps
  them beside the records).
So TVM's JSONDatabase here reads the share's workload file and a scratch records file (`.tunekit-open-records.json`)
that holds each workload's best `seeds` lines. What TVM appends to the scratch file at a commit is moved to the
share's records file and fsynced, with its key, before the commit returns: the share's file stays the one
complete record of the run, and a crash loses nothing that was reported measured.
"""
from __future__ import annotations

import dataclasses
import math
import os
import threading

from .jsonl import RECORDS, WORKLOADS, read_workloads
from . import trace_keys

SCRATCH = ".tunekit-open-records.json"
INIT_MEASURED_RATIO = 0.2  # EvolutionarySearch's default, which tunekit keeps


def seeds_per_workload(population: int) -> int:
    """How many of a workload's best records its search asks for (PickBestFromDatabase)."""
    return max(1, math.ceil(population * INIT_MEASURED_RATIO))


@dataclasses.dataclass
class _Opened:
    db_dir: str
    scratch: str
    known: dict  # {workload module: {trace key: (run_secs, tensorized)}}: at the open, and every commit since
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def remember(self, mod, key: str, secs: list, tensorized: bool) -> None:
        """A record committed since the open: a second search on this database (a client's next tune call)
        must not measure it again."""
        import tvm_ffi

        # the same object first (every commit of a task after its first): structural equality only for a new one
        found = next((v for k, v in self.known.items() if k.same_as(mod)), None)
        if found is None:
            found = next((v for k, v in self.known.items() if tvm_ffi.structural_equal(k, mod)), None)
        if found is None:
            found = self.known[mod] = {}
        found[key] = (secs, tensorized)


_OPENED: dict[str, _Opened] = {}  # scratch path -> the share it stands for


def open_for_tuning(db_dir: str, *, seeds: int):
    """A JSONDatabase for tuning into `db_dir` (see the module doc): its search sees each workload's best
    `seeds` records, commit_durably() appends to `db_dir`'s files, and known_traces() gives every record's
    key. A cut-off last line (a crash) is repaired first, as open_database() does."""
    from .database import json_database, repair_on_open, valid_mean_us

    os.makedirs(db_dir, exist_ok=True)
    repair_on_open(db_dir)
    keyed = trace_keys.keyed_records(db_dir)
    best: dict[int, list] = {}
    for order, (line, _, _) in enumerate(keyed):
        mean = valid_mean_us(line.run_secs, line.trace)
        if mean is not None:
            best.setdefault(line.workload, []).append((mean, order, line.text))
    kept = sorted(row for rows in best.values() for row in sorted(rows)[:seeds])
    scratch = os.path.join(db_dir, SCRATCH)
    with open(scratch + ".tmp", "w") as fh:
        fh.write("".join(text + "\n" for _, _, text in sorted(kept, key=lambda row: row[1])))
    os.replace(scratch + ".tmp", scratch)
    database = json_database(path_workload=os.path.join(db_dir, WORKLOADS), path_tuning_record=scratch)
    _OPENED[os.path.abspath(scratch)] = _Opened(db_dir, scratch, _known(db_dir, keyed))
    return database


def _known(db_dir: str, keyed: list) -> dict:
    from tvm.s_tir import meta_schedule as ms

    workloads = read_workloads(db_dir)
    mods: dict[int, object] = {}
    known: dict = {}
    for line, key, tensorized in keyed:
        if line.workload not in mods:
            mods[line.workload] = ms.database.Workload.from_json(workloads[line.workload]).mod
        secs = [float(s) for s in (line.run_secs or [])]
        known.setdefault(mods[line.workload], {})[key] = (secs, tensorized)
    return known


def _opened(database) -> _Opened | None:
    path = getattr(database, "path_tuning_record", None)
    return _OPENED.get(os.path.abspath(str(path))) if path else None


def read_known(db_dir: str) -> dict:
    """known_traces() of the records in `db_dir`, read without writing there (the coordinator's clients
    read the share's database at once; keys it lacks are computed, not kept)."""
    return _known(db_dir, trace_keys.keyed_records(db_dir, write=False))


def known_traces(database) -> dict:
    """{workload module: {trace key: (run_secs, tensorized)}} of every record in `database`: kept from
    its open for a database of open_for_tuning(), else computed from its parsed records. A dict (what
    read_known() returns) is that already."""
    if isinstance(database, dict):
        return database
    opened = _opened(database)
    if opened is not None:
        return opened.known
    seen: dict = {}
    for record in database.get_all_tuning_records():
        key, mark = trace_keys.key_and_mark(record.trace)
        seen.setdefault(record.workload.mod, {})[key] = ([float(s) for s in (record.run_secs or [])], mark)
    return seen


def commit_durably(database, record, *, key: tuple[str, bool] | None = None) -> None:
    """`database.commit_tuning_record(record)`, then the records file is fsynced. For a database of
    open_for_tuning(), the line TVM appended to the scratch file goes to the share's records file first,
    and its key beside it (the records before the key: a line without a key is keyed at the next open).
    `key`: the record's (trace key, tensorized) when the caller has it (else computed here)."""
    from .database import fsync_file

    opened = _opened(database)
    if opened is None:
        database.commit_tuning_record(record)
        path = getattr(database, "path_tuning_record", None)
        if path:
            fsync_file(str(path))
        return
    key, mark = key if key is not None else trace_keys.key_and_mark(record.trace)
    with opened.lock:
        size = os.path.getsize(opened.scratch)
        database.commit_tuning_record(record)
        with open(opened.scratch, "r+b") as fh:
            fh.seek(size)
            added = fh.read()
            # TVM keeps what it committed in memory and only ever appends to the file: the scratch file
            # goes back to the seeds, so that the run's records are not kept twice on disk
            fh.truncate(size)
        with open(os.path.join(opened.db_dir, RECORDS), "ab") as fh:
            fh.write(added)
            fh.flush()
            os.fsync(fh.fileno())
        lines = [text for text in added.decode().split("\n") if text.strip()]
        trace_keys.append_keys(opened.db_dir, [(trace_keys.line_id(text), key, mark) for text in lines])
        opened.remember(record.workload.mod, key, [float(s) for s in (record.run_secs or [])], mark)


def commit_workload_durably(database, mod):
    """`database.commit_workload(mod)`, then the workload file is fsynced. Returns the workload."""
    from .database import fsync_file

    workload = database.commit_workload(mod)
    path = getattr(database, "path_workload", None)
    if path:
        fsync_file(str(path))
    return workload
