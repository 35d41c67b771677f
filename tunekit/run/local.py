"""The one-process executor: a share's fleet and tuning client in this process, no Ray."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import threading
import time

from ..clients.engine import Engine
from ..clients.measurement import FleetAddress, Measurement, overlap_allowed
from ..config import TuneConfig
from ..errors import TunekitError
from .executor import ShareJob
from .session import ShareSession


class LocalExecutor:
    name = "local"

    def __init__(self, config: TuneConfig, *, rpc_secret: bytes | None):
        self.config = config
        self.rpc_secret = rpc_secret
        self.engine = Engine.create(config.engine)
        self._warm: _Warmup | None = None  # the group's warm-up, while the pipeline is inside warm_up()

    @contextlib.contextmanager
    def connect(self):
        yield self

    def recover(self, job: ShareJob) -> None:
        pass  # one process writes straight into the share's database: nothing to merge

    def measures_every_share(self, jobs: list[ShareJob]) -> bool:
        """Several shares, one search: each candidate built once and measured at every share."""
        return len(jobs) > 1 and not self.config.search_per_share and getattr(self.engine, "measures_every_share",
                                                                              False)

    def groups(self, jobs: list[ShareJob]) -> list[list[ShareJob]]:
        if self.config.robust and not self.measures_every_share(jobs):
            raise TunekitError("--robust needs several shares measured by one search (the tunekit engine)")
        if self.measures_every_share(jobs):
            # The largest share first: its target builds the candidates (on a CPU, its core count)
            # and its booking covers the others, which take turns with it.
            first = max(jobs, key=lambda job: job.share.pct)
            return [[first, *[job for job in jobs if job is not first]]]
        return [[job] for job in jobs]

    def progress_total(self, group: list[ShareJob]) -> int:
        return self.config.trials if self.measures_every_share(group) else self.config.trials * len(group)

    @contextlib.contextmanager
    def group_sessions(self, group: list[ShareJob]):
        with contextlib.ExitStack() as stack:
            first = stack.enter_context(ShareSession.for_tuning(group[0].share, self.config))
            sessions = {group[0].label: first}
            for job in group[1:]:
                sessions[job.label] = stack.enter_context(ShareSession.for_tuning(job.share, self.config, within=first))
            yield sessions

    @contextlib.contextmanager
    def warm_up(self, group: list[ShareJob], sessions: dict):
        """Start the group's fleets (and the tunekit engine's build workers, runner and cost models)
        on a thread while the pipeline compiles and times the untuned model; `tune` takes them over.
        On the H100 machine these were ~35 s of a ResNet-18 run's `tune_s` beyond its tuning wall."""
        warm = _Warmup(lambda stack, steps: self._start(group, sessions, stack, steps))
        self._warm = warm
        try:
            yield warm
        finally:
            self._warm = None
            warm.close()  # unless `tune` has (the untuned model was refused, Ctrl-C, ...)

    def _start(self, group: list[ShareJob], sessions: dict, stack: contextlib.ExitStack, steps: dict):
        """{label: (fleet, Measurement)} and the engine's started parts (None: it has none). `steps`
        gets the seconds of each step: the fleets, making the engine, and its build workers importing
        TVM (`build_workers_s`, from the engine's build pool being made).

        A CPU share's warm-up waits for the build workers: they import TVM on the cores the untuned
        model is timed on. A GPU share's does not, and the first searches of tuning overlap their
        start (as they did inside `tune` before the warm-up existed). Waiting for them on the H100
        made the warm-up 53.5 s, and tuning waited 40 s for it, while the tuning wall of the code
        before, which overlapped them, was 20 s longer (ResNet-18, 32 trials; see
        benchmarks/results/startup-latency-process-warm-up)."""
        clock = time.perf_counter()
        fleets = self._start_fleets(group, sessions, stack, steps)
        steps["fleets_s"], clock = time.perf_counter() - clock, time.perf_counter()
        start = getattr(self.engine, "start", None)
        engine = None
        if start is not None:
            first = group[0]
            engine = start(target=first.target, measurements={job.label: fleets[job.label][1] for job in group},
                           work_dir=first.work_dir, config=self.config)
            stack.callback(engine.shutdown)
            steps["engine_s"] = time.perf_counter() - clock
            engine.builder.on_warm(lambda seconds: steps.__setitem__("build_workers_s", seconds))
            if first.share.kind == "cpu":
                engine.builder.wait_until_warm()  # warm means its workers have imported TVM
        return fleets, engine

    def tune(self, group: list[ShareJob], sessions: dict, progress) -> dict:
        from ..clients.measurement import ShareToMeasure
        from ..records.database import open_database

        warm = self._warm or _Warmup(lambda stack, steps: self._start(group, sessions, stack, steps),
                                     before_tuning=False)
        try:
            fleets, engine = warm.result()
            shares = [ShareToMeasure(job.label, open_database(job.db_dir), fleets[job.label][1], job.db_dir)
                      for job in group]
            started = {"engine": engine} if engine is not None else {}
            if len(group) > 1:
                first = group[0]
                outcomes = self.engine.tune_shares(tasks=first.tasks, target=first.target, shares=shares,
                                                   work_dir=first.work_dir, config=self.config, progress=progress,
                                                   **started)
            else:
                job, share = group[0], shares[0]
                outcomes = {job.label: self.engine.tune(tasks=job.tasks, target=job.target, database=share.database,
                                                        work_dir=job.work_dir, measurement=share.measurement,
                                                        config=self.config, progress=progress,
                                                        records_dir=job.db_dir, **started)}
            for label, (fleet, _) in fleets.items():
                outcomes[label].server_restarts = fleet.restarts
                outcomes[label].faults = {**fleet.fault_counts(), **outcomes[label].faults}
                outcomes[label].phases["warm_up"] = warm.describe()
        finally:
            warm.close()  # the servers and build workers go now, before the tuned model is compiled and timed
        return outcomes

    def _start_fleets(self, group: list[ShareJob], sessions: dict, stack: contextlib.ExitStack, steps: dict) -> dict:
        """{label: (fleet, Measurement)}, the group's fleets started at once: each waits on processes that
        import TVM, so one after another they added up (2-core machine, cpu 50,100: 3.9 s, at once 3.1 s).
        On the H100 it buys nothing yet: two MPS shares' fleets started at once took 23 s, about what one
        after another took (three in 34 s in a BERT study), as if their CUDA start were serialized.
        `steps["fleet_starts"]`: each one's start and end, in seconds from the first. A fleet that fails to
        start is raised after the others started, and all of them stop with `stack`."""
        import concurrent.futures

        managers = {job.label: self._fleet(job, sessions[job.label]) for job in group}
        origin = time.perf_counter()
        spans: dict[str, list[float]] = {}

        def enter(label: str):
            begun = time.perf_counter() - origin
            try:
                return managers[label].__enter__()
            finally:
                spans[label] = [round(begun, 3), round(time.perf_counter() - origin, 3)]

        with concurrent.futures.ThreadPoolExecutor(max_workers=len(group), thread_name_prefix="tunekit-fleet") as pool:
            started = {label: pool.submit(enter, label) for label in managers}
        fleets, error = {}, None
        for label, future in started.items():
            try:
                fleets[label] = future.result()
            except BaseException as exc:  # the others are stopped with the stack; the first error is raised
                error = error or exc
                continue
            stack.push(managers[label].__exit__)
        steps["fleet_starts"] = spans
        if error is not None:
            raise error
        return fleets

    @contextlib.contextmanager
    def _fleet(self, job: ShareJob, session: ShareSession):
        """The share's runner servers (a fleet pinned to the share) and where to reach them."""
        from ..servers.fleet import FleetConfig, RunnerFleet
        from ..shares.pinning import measurement_cores

        fleet_config = FleetConfig(servers=self.config.servers, server_mode=self.config.server_mode,
                                   host=self.config.listen_host, secret=self.rpc_secret, log_dir=job.log_dir)
        pinned = session.pinned
        if job.share.kind == "gpu" and overlap_allowed("gpu", self.config) and self.config.measure_lock is not False:
            # the servers launch kernels from a core the builds and the search leave alone; one core
            # serves every server because the measurement lock lets one of them work at a time
            pinned = dataclasses.replace(pinned, cores=measurement_cores(list(os.sched_getaffinity(0))))
        with RunnerFleet(key=f"tunekit-{job.label}", pinned=pinned, config=fleet_config) as fleet:
            yield fleet, Measurement(
                fleets=[FleetAddress(fleet_config.connect_host, fleet.tracker_port, fleet.key, self.config.servers,
                                     on_hang=fleet.stop_server_on_port)],
                device_kind=job.share.kind, label=job.label, share_cores=pinned.cores,
                share_env=pinned.env, secret=self.rpc_secret)


class _Warmup:
    """`start(stack, steps)` run on a thread from now on; what it enters into `stack` lives until
    close(), and what it puts in `steps` (seconds per step) goes into the report.

    `settle(job)`: called by the pipeline before it times a model at `job`'s share. A CPU share
    waits for the start to end (its servers and build workers import TVM on the share's cores,
    which would slow the timing); a GPU share does not (the untuned model runs as one CUDA graph
    whose time is the GPU's, and 16 build workers starting cost ~35 s on the H100 machine)."""

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
