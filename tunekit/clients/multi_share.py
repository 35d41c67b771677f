"""Measure every candidate at every share: one search, one build, a measurement per share.

A compiled candidate does not depend on the share it runs at; only its timing does. So a run over
several shares searches and builds once and measures each candidate on a server at every share;
each share's database gets the candidate with the time measured at that share (one database per
share: TVM's lookup ignores the target).

MultiShareRunner puts each runner input on every share's runner (or on the ones asked for) and answers with a
future whose `result()` is the first share's RunnerResult, as MetaSchedule expects, and whose `results()` gives
every share's.
"""
from __future__ import annotations

from ..counts import sum_counts


class _Timings:
    """The runners' per-candidate timings, popped by artifact path, summed over the shares (one
    candidate is uploaded, loaded and run once per share)."""

    def __init__(self, runners: dict):
        self.runners = runners

    def pop(self, key, default=None):
        found = [r.timings.pop(key, None) for r in self.runners.values()]
        found = [t for t in found if t is not None]
        if not found:
            return default
        total = found[0]
        for timing in found[1:]:
            total.load_s += timing.load_s
            total.run_s += timing.run_s
            total.lock_wait_s += timing.lock_wait_s
        return total


class SharedFuture:
    """One candidate measured at every share."""

    def __init__(self, futures: dict):
        self.futures = futures  # share label -> runner future

    def done(self) -> bool:
        return all(f.done() for f in self.futures.values())

    def result(self):
        return next(iter(self.futures.values())).result()

    def results(self) -> dict:
        return {label: future.result() for label, future in self.futures.items()}


class MultiShareRunner:
    """Satisfies clients.runner_protocol.MeasuringRunner over {share label: runner}; the first share
    listed is the primary one (its result is what `result()` gives)."""

    def __init__(self, runners: dict):
        if not runners:
            raise ValueError("MultiShareRunner needs at least one share")
        self.runners = runners
        self.timings = _Timings(runners)

    @property
    def labels(self) -> list[str]:
        return list(self.runners)

    def run(self, runner_inputs: list, *, labels: list[str] | None = None) -> list[SharedFuture]:
        """Each input measured at every share, or at the shares `labels` names (a fleet's workload that only some
        of its models have: the others' shares need no time of it)."""
        chosen = self.runners if labels is None else {label: self.runners[label] for label in labels}
        per_share = {label: runner.run(runner_inputs) for label, runner in chosen.items()}
        return [SharedFuture({label: futures[i] for label, futures in per_share.items()})
                for i in range(len(runner_inputs))]

    @property
    def fatal(self):
        """Every server of any share gone stops the run: that share's records would fall behind."""
        return next((r.fatal for r in self.runners.values() if r.fatal is not None), None)

    @property
    def hangs(self) -> int:
        return sum(r.hangs for r in self.runners.values())

    @property
    def session_failures(self) -> int:
        return sum(r.session_failures for r in self.runners.values())

    def fault_counts(self) -> dict:
        return sum_counts(r.fault_counts() for r in self.runners.values())

    def shutdown(self) -> None:
        for runner in self.runners.values():
            runner.shutdown()

