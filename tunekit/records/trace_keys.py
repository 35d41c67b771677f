"""The identity of a candidate (its trace key), and the keys of a database's records kept beside them.

A trace key is the sha1 of a trace's decisions, postprocessing excluded: two candidates with the same key
are the same schedule, so one is never measured twice. Computing it needs the parsed trace, and parsing a
record costs tens of milliseconds (33 ms for an fp16 ResNet-18 record on the 2-core machine). So each
record's key is written when the record is committed, to `tunekit-trace-keys.jsonl` in the database dir:
one line `[sha1 of the record's line, trace key, tensorized]` per record line. A record line without one
(records of an older tunekit, or lines merged from elsewhere) is parsed alone, once, and its key added.
"""
from __future__ import annotations

import hashlib
import json
import os

from .jsonl import RecordLine, read_records

KEYS = "tunekit-trace-keys.jsonl"

# MultiLevelTilingTensorCore (and the CPU rules that tensorize) annotate the block they tile for an
# intrinsic; the RewriteTensorize postproc then tensorizes it. In a trace this annotation is how a
# candidate that uses tensor cores shows.
TENSORIZE_MARK = "meta_schedule.auto_tensorize"


def _plain(value):
    """A trace's JSON with TVM's scalars as Python's. A trace as the search made it holds IntImm where
    the same trace parsed from a record holds an int (an Annotate's value), so keys taken from the
    objects as they are never matched a resumed run's records to the search's candidates."""
    if isinstance(value, bool):
        return int(value)
    if value is None or isinstance(value, (int, float, str)):
        return value
    inner = getattr(value, "value", None)  # IntImm, FloatImm
    if isinstance(inner, (bool, int, float)):
        return int(inner) if isinstance(inner, bool) else inner
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "__iter__"):
        return [_plain(v) for v in value]
    return str(value)


def trace_text(trace) -> str:
    return json.dumps(_plain(trace.as_json(remove_postproc=True)), sort_keys=True)


def trace_key(trace) -> str:
    """Identity of a candidate: its trace with every sampling decision (postprocs excluded)."""
    return hashlib.sha1(trace_text(trace).encode()).hexdigest()


def is_tensorized(trace) -> bool:
    """Whether a candidate's schedule maps a block onto a tensor intrinsic (tensor cores on CUDA)."""
    return TENSORIZE_MARK in trace_text(trace)


def key_and_mark(trace) -> tuple[str, bool]:
    text = trace_text(trace)
    return hashlib.sha1(text.encode()).hexdigest(), TENSORIZE_MARK in text


def line_id(text: str) -> str:
    """A record line's identity: the sha1 of the line as it is in the records file."""
    return hashlib.sha1(text.encode()).hexdigest()


def read_keys(db_dir: str) -> dict[str, tuple[str, bool]]:
    """{line id: (trace key, tensorized)}; a line cut off by a crash is skipped (its record is keyed again)."""
    path = os.path.join(db_dir, KEYS)
    keys: dict[str, tuple[str, bool]] = {}
    if not os.path.isfile(path):
        return keys
    with open(path) as fh:
        for line in fh:
            try:
                lid, key, tensorized = json.loads(line)
            except ValueError:
                continue
            keys[lid] = (key, bool(tensorized))
    return keys


def append_keys(db_dir: str, rows: list[tuple[str, str, bool]]) -> None:
    """Append `[line id, trace key, tensorized]` rows, fsynced (after the records they key)."""
    if not rows:
        return
    path = os.path.join(db_dir, KEYS)
    text = "".join(json.dumps([lid, key, bool(mark)]) + "\n" for lid, key, mark in rows)
    with open(path, "ab+") as fh:
        # A crash mid-append leaves a line cut off: start on a line of its own, or the first new row
        # would run on from it and be lost with it.
        if fh.seek(0, os.SEEK_END) > 0:
            fh.seek(-1, os.SEEK_END)
            if fh.read(1) != b"\n":
                text = "\n" + text
        fh.write(text.encode())
        fh.flush()
        os.fsync(fh.fileno())


def keyed_records(db_dir: str, *, write: bool = True) -> list[tuple[RecordLine, str, bool]]:
    """Every record line of `db_dir` with its trace key and tensorized mark. Lines whose key is not kept
    are parsed (on a thread per core: TVM's parse lets go of the GIL), their target's tensor intrinsics
    registered first; with `write`, their keys are appended so that the next open reads them."""
    kept = read_keys(db_dir)
    lines = list(read_records(db_dir))
    missing = [line for line in lines if line_id(line.text) not in kept]
    if missing:
        added = _key_lines(db_dir, missing)
        kept.update((lid, (key, mark)) for lid, key, mark in added)
        if write:
            append_keys(db_dir, added)
    return [(line, *kept[line_id(line.text)]) for line in lines if line_id(line.text) in kept]


def _key_lines(db_dir: str, lines: list[RecordLine]) -> list[tuple[str, str, bool]]:
    import concurrent.futures

    from tvm.s_tir import meta_schedule as ms

    from ..metaschedule_env import import_for_target
    from .jsonl import read_workloads

    rows = read_workloads(db_dir)
    usable = [line for line in lines  # a record of a cut-off workload line is unusable, as JSONDatabase finds it
              if 0 <= line.workload < len(rows) and rows[line.workload] is not None]
    for kind in sorted({line.record[2].get("kind") for line in usable
                        if len(line.record) > 2 and isinstance(line.record[2], dict)} - {None}):
        import_for_target(kind)  # a tensor-core trace names intrinsics that must be registered to parse
    workloads = {index: ms.database.Workload.from_json(rows[index]) for index in {line.workload for line in usable}}

    def key(line: RecordLine) -> tuple[str, str, bool]:
        parsed = ms.database.TuningRecord.from_json(line.record, workloads[line.workload])
        return (line_id(line.text), *key_and_mark(parsed.trace))

    with concurrent.futures.ThreadPoolExecutor(max(1, len(os.sched_getaffinity(0)))) as pool:
        return list(pool.map(key, usable))
