"""The one-process executor: a share's fleet and tuning client in this process, no Ray."""
from __future__ import annotations

import contextlib
import dataclasses
import os
import time

from ..clients.engine import Engine
from ..clients.measurement import FleetAddress, Measurement, overlap_allowed
from ..config import TuneConfig
from ..errors import TunekitError
from .executor import ShareJob
from .session import ShareSession
from .warmup import WarmUps


class LocalExecutor:
    name = "local"

    def __init__(self, config: TuneConfig, *, rpc_secret: bytes | None):
        self.config = config
        self.rpc_secret = rpc_secret
        self.engine = Engine.create(config.engine)
        self._warm_ups = WarmUps()

    @contextlib.contextmanager
    def connect(self):
        yield self

    def recover(self, job: ShareJob) -> None:
        pass  # one process writes straight into the share's database: nothing to merge

    def measures_every_share(self, jobs: list[ShareJob]) -> bool:
        """Several shares, one search: each candidate built once and measured at every share."""
        return len(jobs) > 1 and getattr(self.engine, "measures_every_share", False)

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

    def warm_up(self, group: list[ShareJob], sessions: dict):
        """Start the group's fleets (and the tunekit engine's build workers, runner and cost models)
        on a thread while the pipeline compiles and times the untuned model; `tune` takes them over,
        so their start is not added to `tune_s`."""
        return self._warm_ups.hold(lambda stack, steps: self._start(group, sessions, stack, steps))

    def _start(self, group: list[ShareJob], sessions: dict, stack: contextlib.ExitStack, steps: dict):
        """{label: (fleet, Measurement)} and the engine's started parts (None: it has none). `steps`
        gets the seconds of each step: the fleets, making the engine, and its build workers importing
        TVM (`build_workers_s`, from the engine's build pool being made).

        A CPU share's warm-up waits for the build workers: they import TVM on the cores the untuned
        model is timed on. A GPU share's does not, and the first searches of tuning overlap their
        start (as they did inside `tune` before the warm-up existed): waiting for them made tuning wait
        longer than the overlap saved (benchmarks/RESULTS.md, "process warm-up")."""
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

    def _open_records(self, db_dir: str):
        """The share's database for this run's engine. tunekit's loop commits through
        records.tuning_database, so its database parses only the records its search seeds from; the
        stock engine commits with TVM's own callback, into a JSONDatabase of the whole dir."""
        from ..records.database import open_database
        from ..records.tuning_database import open_for_tuning, seeds_per_workload

        if self.engine.name != "tunekit":
            return open_database(db_dir)
        return open_for_tuning(db_dir, seeds=seeds_per_workload(self.config.population))

    def tune(self, group: list[ShareJob], sessions: dict, progress) -> dict:
        from ..clients.measurement import ShareToMeasure

        warm = self._warm_ups.take(lambda stack, steps: self._start(group, sessions, stack, steps))
        try:
            fleets, engine = warm.result()
            # timed per share: a resumed run's open was most of its start-up before records.tuning_database
            opened, shares = {}, []
            for job in group:
                clock = time.perf_counter()
                shares.append(ShareToMeasure(job.label, self._open_records(job.db_dir), fleets[job.label][1],
                                             job.db_dir))
                opened[job.label] = round(time.perf_counter() - clock, 3)
            started = {"engine": engine} if engine is not None else {}
            if len(group) > 1:
                first = group[0]
                outcomes = self.engine.tune_shares(tasks=first.tasks, target=first.target, shares=shares,
                                                   work_dir=first.work_dir, config=self.config, progress=progress,
                                                   task_shares=first.task_shares, fused_tasks=first.fused_tasks,
                                                   task_models=first.task_models,
                                                   **started)
            else:
                job, share = group[0], shares[0]
                outcomes = {job.label: self.engine.tune(tasks=job.tasks, target=job.target, database=share.database,
                                                        work_dir=job.work_dir, measurement=share.measurement,
                                                        config=self.config, progress=progress,
                                                        records_dir=job.db_dir, fused_tasks=job.fused_tasks,
                                                        task_models=job.task_models,
                                                        **started)}
            for label, (fleet, _) in fleets.items():
                outcomes[label].server_restarts = fleet.restarts
                outcomes[label].faults = {**fleet.fault_counts(), **outcomes[label].faults}
                outcomes[label].phases["warm_up"] = warm.describe()
                outcomes[label].phases["open_records_s"] = opened[label]
        finally:
            warm.close()  # the servers and build workers go now, before the tuned model is compiled and timed
        return outcomes

    def _start_fleets(self, group: list[ShareJob], sessions: dict, stack: contextlib.ExitStack, steps: dict) -> dict:
        """{label: (fleet, Measurement)}, the group's fleets started at once: each waits on processes that
        import TVM, so one after another they add up. On a GPU it buys nothing yet: MPS shares' fleets
        started at once take about as long as one after another, as if their CUDA start were serialized.
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
        if job.share.kind == "gpu" and overlap_allowed("gpu", self.config) and self.config.measure_lock in (True, "auto"):
            # the servers launch kernels from a core the builds and the search leave alone; one core
            # serves every server because the measurement lock lets one of them work at a time
            pinned = dataclasses.replace(pinned, cores=measurement_cores(list(os.sched_getaffinity(0))))
        with RunnerFleet(key=f"tunekit-{job.label}", pinned=pinned, config=fleet_config) as fleet:
            yield fleet, Measurement(
                fleets=[FleetAddress(fleet_config.connect_host, fleet.tracker_port, fleet.key, self.config.servers,
                                     on_hang=fleet.stop_server_on_port)],
                device_kind=job.share.kind, label=job.label, share_cores=pinned.cores,
                share_env=pinned.env, secret=self.rpc_secret)
