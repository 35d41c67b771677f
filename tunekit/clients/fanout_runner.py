"""One runner over several fleets: each candidate goes to the least-busy one.

A share can have servers on several GPUs, nodes or core sets, each fleet with its own tracker;
a tuning client measures on all of them through one of these. Each child is a SessionRunner.
"""
from __future__ import annotations

import threading

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner

from ..counts import sum_counts


@derived_object
class FanoutRunner(PyRunner):
    def __init__(self, runners: list):
        super().__init__()
        if not runners:
            raise ValueError("FanoutRunner needs at least one runner")
        self.runners = runners
        self.timings: dict = {}
        self._outstanding: list[list] = [[] for _ in runners]  # futures handed out, per runner
        self._lock = threading.Lock()  # the search loop's stage threads hand candidates in concurrently
        for runner in runners:  # one dict: the tuning loop reads timings by artifact path
            runner.timings = self.timings

    def run(self, runner_inputs):
        with self._lock:
            return self._run(runner_inputs)

    def _run(self, runner_inputs):
        futures = []
        self._outstanding = [[f for f in mine if not f.done()] for mine in self._outstanding]
        alive = [i for i, r in enumerate(self.runners) if getattr(r, "fatal", None) is None] or [0]
        for runner_input in runner_inputs:
            k = min(alive,
                    key=lambda i: len(self._outstanding[i]) / max(1, self.runners[i].config.sessions))
            new = list(self.runners[k].run([runner_input]))
            self._outstanding[k] += new
            futures += new
        return futures

    @property
    def fatal(self):
        """Set when every fleet of the share is gone (each child gave up): the run must stop."""
        errors = [getattr(r, "fatal", None) for r in self.runners]
        return errors[0] if all(e is not None for e in errors) else None

    @property
    def hangs(self) -> int:
        return sum(r.hangs for r in self.runners)

    @property
    def session_failures(self) -> int:
        return sum(r.session_failures for r in self.runners)

    def fault_counts(self) -> dict:
        return sum_counts(runner.fault_counts() for runner in self.runners)

    def shutdown(self) -> None:
        for runner in self.runners:
            runner.shutdown()
