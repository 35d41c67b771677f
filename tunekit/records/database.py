"""One MetaSchedule JSON database per (target, share).

TVM's database lookup ignores the target, so records tuned at 100% would be picked for a 40%
build if they shared a database: the directory name carries the share to keep them apart.
"""
from __future__ import annotations

import json
import os

from ..errors import TunekitError
from .jsonl import RECORDS, WORKLOADS, count_records, read_records, read_workloads


FAILED_RUN_SECS = 1e10  # what MetaSchedule records for a failed candidate


def mean_run_us(run_secs) -> float | None:
    """Mean measured time of a record in microseconds; None for a failed (or empty) measurement."""
    secs = [float(s) for s in (run_secs or [])]
    if not secs or min(secs) >= FAILED_RUN_SECS / 10:
        return None
    return sum(secs) / len(secs) * 1e6


def database_dir(out_dir: str, share_label: str) -> str:
    return os.path.join(out_dir, f"records-{share_label}")


def repair_truncated_tail(path: str) -> int:
    """Cut a last line that a crash left half-written (TVM's JSONDatabase refuses the whole file
    with "Unexpected end of string"). The cut bytes are kept beside the file, not thrown away.
    Returns how many bytes were moved aside."""
    if not os.path.isfile(path):
        return 0
    with open(path, "rb") as fh:
        data = fh.read()
    keep = len(data)
    while keep:
        start = data.rfind(b"\n", 0, keep - 1) + 1
        line = data[start:keep].strip()
        if not line:
            keep = start
            continue
        try:
            json.loads(line)
            break
        except ValueError:
            keep = start
    if keep == len(data):
        return 0
    import logging
    import time

    aside = f"{path}.damaged-{int(time.time())}"
    with open(aside, "wb") as fh:
        fh.write(data[keep:])
    with open(path, "r+b") as fh:
        fh.truncate(keep)
        fh.flush()
        os.fsync(fh.fileno())
    logging.getLogger("tunekit.records").warning("repaired %s: a cut-off last line (%d bytes) moved to %s",
                                                 path, len(data) - keep, aside)
    return len(data) - keep


_REPAIRED: dict[str, int] = {}  # database dir -> bytes moved aside when it was last opened


def json_database(path: str | None = None, **kwargs):
    """TVM's JSONDatabase on the dir `path` (or on `path_workload=` / `path_tuning_record=` files).
    JSONDatabase parses every record's trace when it opens, and a tensor-core trace names its
    intrinsics (wmma_fill_16x16x16_f32, ...), which must be registered first: a GPU run's --resume,
    warm start or `tunekit compile` otherwise died with "TensorIntrin ... is not registered". Only
    then are the intrinsics imported (tens of seconds on a small CPU, so not for every database)."""
    from tvm.s_tir import meta_schedule as ms

    from ..metaschedule_env import import_for_target

    if path is not None:
        kwargs["work_dir"] = path
    try:
        return ms.database.JSONDatabase(module_equality="structural", **kwargs)
    except Exception as exc:
        if "TensorIntrin" not in str(exc):
            raise
    for kind in ("cuda", "llvm"):
        import_for_target(kind)
    return ms.database.JSONDatabase(module_equality="structural", **kwargs)


def repair_on_open(path: str) -> None:
    """A cut-off last line of either file (a crash mid-append) moved aside before TVM reads them
    (repaired_bytes says how much)."""
    _REPAIRED[os.path.abspath(path)] = sum(repair_truncated_tail(os.path.join(path, name))
                                           for name in (WORKLOADS, RECORDS))


def open_database(path: str, *, create: bool = True, read_only: bool = False):
    """A share's JSONDatabase. `read_only` (another run's records, e.g. a warm start's source): a
    cut-off last line is not repaired in place, and a database TVM cannot read is one clear error."""
    if (not create or read_only) and not os.path.isfile(os.path.join(path, RECORDS)):
        raise TunekitError(f"no tuning records in {path} (expected {RECORDS})")
    if read_only:
        try:
            return json_database(path, allow_missing=False)
        except Exception as exc:
            text = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            raise TunekitError(f"cannot read the records in {path}: {text[:200]}") from None
    os.makedirs(path, exist_ok=True)
    repair_on_open(path)
    database = json_database(path)
    _fsync_dir(path)  # the files JSONDatabase may just have created survive a power cut too
    return database


def open_best_records(path: str, *, create: bool = True):
    """A MemoryDatabase of each workload's best valid record in the share's database dir at `path` (the
    record JSONDatabase.get_top_k(workload, 1) returns; on equal means the first in the file), for
    compiling a model. Opening the whole JSONDatabase parses every trial's trace, a large part of a run's
    finish (benchmarks/RESULTS.md, "open records"). Here only the lines are read, and one trace per
    workload is parsed."""
    if not create and not os.path.isfile(os.path.join(path, RECORDS)):
        raise TunekitError(f"no tuning records in {path} (expected {RECORDS})")
    workloads = read_workloads(path)
    best: dict[int, tuple[float, list]] = {}  # workload index -> (mean run us, record)
    for line in read_records(path):
        mean = valid_mean_us(line.run_secs, line.trace)
        if mean is not None and 0 <= line.workload < len(workloads) and workloads[line.workload] is not None \
                and (line.workload not in best or mean < best[line.workload][0]):
            best[line.workload] = (mean, line.record)
    return parse_records(workloads, [(index, record) for index, (_, record) in sorted(best.items())])


def parse_records(workloads: list, picks: list[tuple[int, list]]):
    """A MemoryDatabase of the record lines `picks` ([(workload index, record)], as records.jsonl reads them),
    `workloads` the workload lines of their file."""
    from tvm.s_tir import meta_schedule as ms

    # A tensor-core trace names intrinsics that must be registered before it parses: the records' target's only
    # (all of them cost tens of seconds on a small CPU; once imported, this is free).
    from ..metaschedule_env import import_for_target

    for kind in sorted({r[2].get("kind") for _, r in picks if len(r) > 2 and isinstance(r[2], dict)} - {None}):
        import_for_target(kind)
    database = ms.database.MemoryDatabase()
    for index, record in picks:
        workload = ms.database.Workload.from_json(workloads[index])
        parsed = ms.database.TuningRecord.from_json(record, workload)
        database.commit_tuning_record(ms.database.TuningRecord(
            parsed.trace, database.commit_workload(workload.mod), parsed.run_secs, parsed.target, parsed.args_info))
    return database


def valid_mean_us(run_secs, trace) -> float | None:
    """The mean run time (us) MetaSchedule sorts a record by, or None where TuningRecord.IsValid says no: no
    measured time (mean_run_us) or no scheduling instruction before the postprocessing."""
    us = mean_run_us([t for t in run_secs or [] if isinstance(t, (int, float))])
    if us is None:
        return None
    instructions = trace[0] if isinstance(trace, list) and trace else []
    first = instructions[0] if instructions else None
    if not isinstance(first, list) or not first or first[0] == "EnterPostproc":  # nothing, or postprocessing only
        return None
    return us


def repaired_bytes(path: str) -> int:
    """Bytes of cut-off lines moved aside when `open_database(path)` last ran (report: faults)."""
    return _REPAIRED.get(os.path.abspath(path), 0)


# ---- durable appends ----
# TVM's JSONDatabase appends one line per commit (open, write, close) but never fsyncs: a crash of
# the machine can lose trials that were already reported measured. tunekit's tuning loop commits
# through records.tuning_database.commit_durably, which fsyncs the records after TVM's append.
# Cost: one fsync per measured trial (benchmarks/faults.py measures it; ~ms on a local disk,
# against ~1 s per trial for search + build + measure).

def fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)  # Linux: flushes the inode's data whatever the fd's access mode
    finally:
        os.close(fd)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the file fsyncs still hold
    finally:
        os.close(fd)


def count_trials(path: str) -> int:
    """Trials already in a database dir (0 if there is none): complete lines only."""
    return count_records(path)


def find_share_databases(records_dir: str) -> dict[str, str]:
    """A tune out dir (records-<share>/...) or one database dir -> {share_label: db dir}."""
    if not os.path.isdir(records_dir):
        raise TunekitError(f"records directory not found: {records_dir}")
    if os.path.isfile(os.path.join(records_dir, RECORDS)):
        label = os.path.basename(os.path.normpath(records_dir)).removeprefix("records-")
        return {label: records_dir}
    found = {name.removeprefix("records-"): os.path.join(records_dir, name)
             for name in sorted(os.listdir(records_dir))
             if name.startswith("records-") and os.path.isfile(os.path.join(records_dir, name, RECORDS))}
    if not found:
        raise TunekitError(f"no tuning records under {records_dir}")
    return found


def summarize(path: str) -> dict:
    """Per-workload trial counts and best latency, read straight from the JSON lines."""
    per: dict = {}
    total = failed = 0
    for line in read_records(path):
        total += 1
        entry = per.setdefault(line.workload, {"trials": 0, "best_us": None})
        entry["trials"] += 1
        mean_us = mean_run_us(line.run_secs)
        if mean_us is None:
            failed += 1
        elif entry["best_us"] is None or mean_us < entry["best_us"]:
            entry["best_us"] = mean_us
    return {"path": path, "workloads": len(read_workloads(path)), "trials": total, "failed_trials": failed,
            "per_workload": [{"workload": k, **v} for k, v in sorted(per.items())]}
