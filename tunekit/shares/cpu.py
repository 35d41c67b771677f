"""Pin a process to a CPU share: affinity + TVM's thread count + the target's num-cores, all consistent."""
from __future__ import annotations

import os

from .share import Share


def cpu_share_env(share: Share) -> dict[str, str]:
    cores = share.cpu_cores()
    # TVM's thread pool follows TVM_NUM_THREADS; affinity (set in preexec) keeps it on the share's cores.
    return {"TVM_NUM_THREADS": str(len(cores)), "OMP_NUM_THREADS": str(len(cores))}


def pin_current_process(cores: list[int]) -> None:
    os.sched_setaffinity(0, cores)
