"""What a tuning engine works with and produces: where candidates are measured (the share's
fleets and cores), the rules for overlapping search with measurement, and the outcome."""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Callable

from ..config import TuneConfig

@dataclass
class TuningOutcome:
    """What tuning one share produced, whichever engine and executor did it (report.json's core)."""

    trials_done: int
    trials_failed: int
    wall_s: float
    tasks: list[dict]
    engine: str = "tunekit"
    trials_cached: int = 0
    phases: dict = field(default_factory=dict)
    session_failures: int = 0
    faults: dict = field(default_factory=dict)      # runner and fleet fault counts
    server_restarts: int = 0
    extra: dict = field(default_factory=dict)       # executor-specific report sections ("coordinator")
    environment: dict = field(default_factory=dict)  # executor-specific environment (the Ray cluster)


@dataclass
class FleetAddress:
    """Where a tuning client reaches one fleet of runner servers (one tracker)."""

    host: str
    port: int
    key: str
    sessions: int                                   # = its servers: one session each
    on_hang: Callable[[int], None] | None = None    # stop the server on this port (a candidate hung it)


@dataclass
class Measurement:
    """Where candidates are measured: the share's fleets, and how the share's cores are laid out."""

    fleets: list[FleetAddress]
    device_kind: str                      # "cpu" or "gpu"
    label: str = ""                       # the share, for messages
    share_cores: list[int] | None = None  # the cores the servers are pinned to (CPU: the share's; GPU: see
                                          # shares.pinning.measurement_cores); builds stay off them
    share_env: dict = field(default_factory=dict)  # what pins a process to the share (MPS vars on GPU)
    shared: bool = False                  # other clients measure on the same servers: give idle sessions back
    secret: bytes | None = field(default=None, repr=False)  # the warm servers' shared secret (never logged)


@dataclass
class ShareToMeasure:
    """One share of a tuning run as an engine sees it: where its candidates are measured and where
    its records (and its cost model) go."""

    label: str
    database: object
    measurement: Measurement
    records_dir: str | None = None


def overlap_allowed(device_kind: str, config: TuneConfig) -> bool:
    """Whether the next batch is searched and built while the last one is measured."""
    if config.overlap in (True, False):
        return config.overlap
    # GPU: building is CPU work; it stays off the core the servers launch from (builder_cores). CPU: the search and the
    # builders would share the machine with the share being measured, and giving them all the
    # cores while the (short) measurement runs alone is faster than splitting the cores.
    return device_kind == "gpu"


def builder_cores(measurement: Measurement, *, overlap: bool, allowed: list[int] | None = None) -> list[int]:
    """Cores for building and searching. When they overlap a measurement they stay off the cores its
    servers are pinned to (if there are others), so that building never disturbs a running
    measurement: on a CPU the share's cores; on a GPU the core its servers launch kernels from."""
    allowed = sorted(allowed if allowed is not None else os.sched_getaffinity(0))
    if overlap and measurement.share_cores:
        others = [c for c in allowed if c not in measurement.share_cores]
        if others:
            return others
    return allowed


@contextlib.contextmanager
def process_on(cores: list[int]):
    """The search (evolutionary mutation, XGBoost) runs in this process: keep it on `cores`."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
