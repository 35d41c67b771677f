"""CPU shares: the thread settings that go with a core set, and what the CPU is called."""
from __future__ import annotations

import platform


def thread_env(cores: list[int]) -> dict[str, str]:
    """Environment for a process pinned to `cores`. TVM's thread pool follows TVM_NUM_THREADS (and
    falls back to OMP_NUM_THREADS); affinity, set at the process start, keeps it on those cores."""
    return {"TVM_NUM_THREADS": str(len(cores)), "OMP_NUM_THREADS": str(len(cores))}


def cpu_model() -> str:
    """The CPU's marketing name (what a record was measured on), or the architecture if unknown."""
    try:
        with open("/proc/cpuinfo") as fh:
            return next(line.split(":", 1)[1].strip() for line in fh if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()
