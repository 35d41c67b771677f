"""Reading a database the way a test checks it (through records.jsonl, the format's only reader)."""
from __future__ import annotations

import os

from ..records.jsonl import RECORDS, read_records, record_keys


def record_lines(db_dir) -> list[str]:
    """The text of every complete trial line, in file order (a line being written is left out)."""
    return [r.text for r in read_records(str(db_dir))]


def distinct(keys: list) -> set:
    """The distinct (workload, trace) pairs: as many as `keys` when nothing was measured twice."""
    return set(keys)


def shard_dirs(out, share: str = "cpu50") -> list[str]:
    """The Ray clients' database shards of `share` under a run's out dir (every run id)."""
    root = os.path.join(str(out), "work", "shards", share)
    found = []
    for dirpath, _, files in os.walk(root):
        if RECORDS in files:
            found.append(dirpath)
    return sorted(found)


__all__ = ["record_lines", "record_keys", "distinct", "shard_dirs"]
