"""What tuning a group needs, started on a thread while the pipeline compiles and times the untuned
model (an executor's `warm_up`); `tune` takes it over with `result()`."""
from __future__ import annotations

import contextlib
import threading
import time

from .executor import ShareJob


class Warmup:
    """`start(stack, steps)` run on a thread from now on; what it enters into `stack` lives until
    close(), and what it puts in `steps` (seconds per step) goes into the report.

    `settle(job)`: called by the pipeline before it times a model at `job`'s share. A CPU share
    waits for the start to end (its servers and build workers import TVM on the share's cores,
    which would slow the timing); a GPU share does not (the untuned model runs as one CUDA graph
    whose time is the GPU's, and waiting for the build workers to start would cost tens of seconds)."""

    def __init__(self, start, *, before_tuning: bool = True):
        self._stack = contextlib.ExitStack()
        self._value = None
        self._error: BaseException | None = None
        self._closed = False
        self._before_tuning = before_tuning
        self._started = time.perf_counter()
        self._took_s = self._waited_s = None
        self._steps: dict[str, float] = {}
        self._thread = threading.Thread(target=self._run, args=(start,), name="tunekit-warm-up", daemon=True)
        self._thread.start()

    def _run(self, start) -> None:
        try:
            self._value = start(self._stack, self._steps)
        except BaseException as exc:  # raised where the value is wanted (result)
            self._error = exc
        self._took_s = time.perf_counter() - self._started

    def settle(self, job: ShareJob) -> None:
        if job.share.kind == "cpu":
            self._thread.join()

    def result(self):
        waiting = time.perf_counter()
        self._thread.join()
        self._waited_s = time.perf_counter() - waiting
        if self._error is not None:
            raise self._error
        return self._value

    def describe(self) -> dict:
        """report.json phases.warm_up: whether the fleets and the engine were started before tuning
        (beside the untuned model), how long that took (`steps`: the fleets, making the engine, its
        build workers importing TVM; on a GPU nothing waits for the last, which may end later), and
        how long tuning then waited for it; `fleet_starts`: when each share's fleet began and ended
        starting, in seconds from the first)."""
        steps = dict(self._steps)
        fleet_starts = steps.pop("fleet_starts", None)  # {label: [start, end]}: seconds, not a step
        described = {"before_tuning": self._before_tuning, "took_s": _rounded(self._took_s),
                     "tuning_waited_s": _rounded(self._waited_s),
                     "steps": {name: _rounded(seconds) for name, seconds in steps.items()}}
        if fleet_starts:
            described["fleet_starts"] = fleet_starts
        return described

    def close(self) -> None:
        if self._closed:
            return
        self._thread.join()  # nothing is left half-started
        self._closed = True
        self._stack.close()


def _rounded(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds, 3)


class WarmUps:
    """An executor's warm-up of the group the pipeline is inside `warm_up()` for: `hold(start)` is that
    context (the warm-up stops with it unless `tune` took it over), `take(start)` is `tune`'s (the held
    warm-up, or `start` run now when the executor was called without one)."""

    def __init__(self):
        self._held: Warmup | None = None

    @contextlib.contextmanager
    def hold(self, start):
        warm = Warmup(start)
        self._held = warm
        try:
            yield warm
        finally:
            self._held = None
            warm.close()  # unless `tune` has (the untuned model was refused, Ctrl-C, ...)

    def take(self, start) -> Warmup:
        return self._held or Warmup(start, before_tuning=False)
