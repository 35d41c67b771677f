"""Seconds per named step of a command (report `command_s`: where the time outside tuning goes)."""
from __future__ import annotations

import contextlib
import time


class StepTimes:
    """`with steps("load_s"): ...` adds the block's seconds to `steps.times["load_s"]` (summed when a step runs
    more than once)."""

    def __init__(self):
        self.times: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str):
        started = time.perf_counter()
        try:
            yield
        finally:
            self.times[name] = round(self.times.get(name, 0.0) + time.perf_counter() - started, 3)
