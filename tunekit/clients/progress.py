"""Progress of a tuning run: trials done / total and best latency, as a MetaSchedule callback."""
from __future__ import annotations

import sys
import time


def make_progress_callback(*, total_trials: int, task_names: list[str], show: bool):
    from tvm.ir.utils import derived_object
    from tvm.s_tir import meta_schedule as ms

    @derived_object
    class ProgressCallback(ms.measure_callback.PyMeasureCallback):
        def __init__(self):
            self.done = 0
            self.failed = 0
            self.best_us: dict[int, float] = {}
            self.started = time.time()
            self.bar = None
            if show:
                from rich.console import Console
                from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

                self.bar = Progress(TextColumn("tuning"), BarColumn(), MofNCompleteColumn(),
                                    TextColumn("{task.fields[status]}"), TimeElapsedColumn(),
                                    console=Console(file=sys.stderr), transient=False)
                self.bar_task = self.bar.add_task("tune", total=total_trials, status="")
                self.bar.start()

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
            if self.bar is not None:
                best = self.best_us.get(task_id)
                status = f"{task_names[task_id][:28]} best {best:.1f} us" if best else task_names[task_id][:28]
                self.bar.update(self.bar_task, completed=min(self.done, total_trials), status=status)

        def close(self):
            if self.bar is not None:
                self.bar.stop()
                self.bar = None

    return ProgressCallback()
