"""Per-workload untuned latency, kept beside a share's database.

A record is only worth applying if it beats what the model runs without it (the naive loops on
CPU, DLight's default schedule on GPU). With a small budget the best record of a task can be
slower than that, and MetaSchedule applies the best record whatever it is. The compiler reads this file and
leaves such workloads to the default schedule.
"""
from __future__ import annotations

import json
import os

from ..atomic import write_json_atomic

BASELINES_FILE = "tunekit-baselines.json"


def workload_key(mod) -> str:
    import tvm_ffi

    return key_of_hash(tvm_ffi.structural_hash(mod))


def key_of_hash(structural_hash) -> str:
    """The workload key of a structural hash, e.g. the first field of a database_workload.json line (a string)."""
    return f"{int(structural_hash) & 0xFFFFFFFFFFFFFFFF:016x}"


def write_baselines(db_dir: str, untuned_us_by_workload: dict[str, float]) -> None:
    path = os.path.join(db_dir, BASELINES_FILE)
    merged = read_baselines(db_dir)
    merged.update({k: v for k, v in untuned_us_by_workload.items() if v is not None})
    write_json_atomic(path, dict(sorted(merged.items())), indent=1)


def read_baselines(db_dir: str) -> dict[str, float]:
    path = os.path.join(db_dir, BASELINES_FILE)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return {}  # a damaged file only loses the filter, never the records
    return {str(k): float(v) for k, v in data.items() if isinstance(v, (int, float))}
