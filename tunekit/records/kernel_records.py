"""A share's measured kernels of other kinds than MetaSchedule's (kernels.triton_gemm): one JSON line each in
`<records dir>/kernel_records.jsonl`, read only here. A line cut off by a crash is skipped, never fatal.

Each says the task's workload key, the kernel's kind and configuration, its run times at the share, and whether its
output matched the task's own at the share (`checked`): a kernel whose output was wrong there is kept, so it is not
measured again, but never chosen (library fp16 kernels were wrong under MPS at 40% on an H200: issue 53)."""
from __future__ import annotations

import dataclasses
import json
import os
import statistics

KERNEL_RECORDS = "kernel_records.jsonl"


@dataclasses.dataclass(frozen=True)
class KernelRecord:
    workload: str          # records.baselines.workload_key of the task
    kind: str              # e.g. "triton"
    config: str            # the kind's name of its configuration (triton_gemm.TileConfig.name)
    run_secs: tuple[float, ...]
    checked: bool          # its output matched the task's at the share
    target: str = ""       # the target it was built for
    error: str = ""        # why it has no time (its build or run failed, or its output was wrong), one line

    @property
    def mean_us(self) -> float | None:
        return statistics.fmean(self.run_secs) * 1e6 if self.run_secs else None


def append(db_dir: str, record: KernelRecord) -> None:
    """One line, flushed and synced: a crash loses at most the line being written."""
    os.makedirs(db_dir, exist_ok=True)
    line = json.dumps({**dataclasses.asdict(record), "run_secs": list(record.run_secs)}, sort_keys=True)
    with open(os.path.join(db_dir, KERNEL_RECORDS), "a") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())


def read(db_dir: str) -> list[KernelRecord]:
    path = os.path.join(db_dir, KERNEL_RECORDS)
    if not os.path.isfile(path):
        return []
    out = []
    with open(path) as fh:
        for line in fh:
            try:
                data = json.loads(line)
                out.append(KernelRecord(workload=str(data["workload"]), kind=str(data["kind"]),
                                        config=str(data["config"]),
                                        run_secs=tuple(float(x) for x in data["run_secs"]),
                                        checked=bool(data["checked"]), target=str(data.get("target", "")),
                                        error=str(data.get("error", ""))))
            except (ValueError, KeyError, TypeError):
                continue  # a line cut off by a crash
    return out


def best_checked(db_dir: str) -> dict[str, KernelRecord]:
    """{workload key: its fastest kernel record whose output was right at the share}."""
    best: dict[str, KernelRecord] = {}
    for record in read(db_dir):
        us = record.mean_us
        if not record.checked or us is None:
            continue
        if record.workload not in best or us < best[record.workload].mean_us:
            best[record.workload] = record
    return best


def copy_into(src_dirs: list[str], into: str, *, keys: set[str] | None = None) -> int:
    """Append to `into`'s kernel records those of `src_dirs` it does not hold (by workload, kind and configuration),
    only of the workloads in `keys` when given: a Ray client's shard merged into the share's records, a fleet's
    records handed to each model. Returns how many it appended."""
    held = {(r.workload, r.kind, r.config) for r in read(into)}
    added = 0
    for src in src_dirs:
        for record in read(src):
            key = (record.workload, record.kind, record.config)
            if key in held or (keys is not None and record.workload not in keys):
                continue
            append(into, record)
            held.add(key)
            added += 1
    return added
