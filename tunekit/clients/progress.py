"""Progress of a tuning run on stderr: trials done / total and the best latency of the current task."""
from __future__ import annotations

import sys
import time


class ProgressBar:
    """A rich progress bar when `show`, else silent (--json, no TTY): the same calls either way. `seconds`: a run that
    only its time budget ends counts its seconds on the bar and its trials beside it."""

    def __init__(self, *, total: int, show: bool, label: str = "tuning", seconds: float | None = None):
        self.total = total
        self.done = 0
        self.seconds = seconds
        self._started = time.monotonic()
        self._bar = None
        if seconds:
            label, total = f"{label} (s)", int(seconds)
        if show:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._bar = Progress(TextColumn(label), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                                 console=Console(file=sys.stderr), transient=False)
            self._id = self._bar.add_task(label, total=total, status="")
            self._bar.start()

    def advance(self, trials: int, *, status: str = "") -> None:
        self.done += trials
        if self._bar is None:
            return
        if self.seconds:
            self._bar.update(self._id, completed=min(time.monotonic() - self._started, self.seconds),
                             status=f"{self.done} trials {status}")
        else:
            self._bar.update(self._id, completed=min(self.done, self.total), status=status)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None


def make_progress_callback(*, progress: ProgressBar, task_names: list[str]):
    """The same progress for stock `ms.tune_tasks` (the baseline engine), as a measure callback."""
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class ProgressCallback(ms.measure_callback.PyMeasureCallback):
        def __init__(self):
            self.done = 0
            self.failed = 0
            self.best_us: dict[int, float] = {}

        def apply(self, task_scheduler, task_id, measure_candidates, builder_results, runner_results):
            for build, run in zip(builder_results, runner_results):
                self.done += 1
                secs = [float(s) for s in (run.run_secs or [])]
                if build.error_msg or run.error_msg or not secs:
                    self.failed += 1
                    continue
                us = sum(secs) / len(secs) * 1e6
                if us < self.best_us.get(task_id, float("inf")):
                    self.best_us[task_id] = us
            best = self.best_us.get(task_id)
            progress.advance(len(builder_results), status=f"{task_names[task_id][:28]} best {best:.1f} us"
                             if best else task_names[task_id][:28])

    return ProgressCallback()
