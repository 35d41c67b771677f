"""The one-process executor: a share's fleet and tuning client in this process, no Ray."""
from __future__ import annotations

import contextlib
import dataclasses
import os

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

    def tune(self, group: list[ShareJob], sessions: dict, progress) -> dict:
        from ..clients.measurement import ShareToMeasure
        from ..records.database import open_database

        with contextlib.ExitStack() as stack:
            fleets = {job.label: stack.enter_context(self._fleet(job, sessions[job.label])) for job in group}
            shares = [ShareToMeasure(job.label, open_database(job.db_dir), fleets[job.label][1], job.db_dir)
                      for job in group]
            if len(group) > 1:
                first = group[0]
                outcomes = self.engine.tune_shares(tasks=first.tasks, target=first.target, shares=shares,
                                                   work_dir=first.work_dir, config=self.config, progress=progress)
            else:
                job, share = group[0], shares[0]
                outcomes = {job.label: self.engine.tune(tasks=job.tasks, target=job.target, database=share.database,
                                                        work_dir=job.work_dir, measurement=share.measurement,
                                                        config=self.config, progress=progress,
                                                        records_dir=job.db_dir)}
            for label, (fleet, _) in fleets.items():
                outcomes[label].server_restarts = fleet.restarts
                outcomes[label].faults = {**fleet.fault_counts(), **outcomes[label].faults}
        return outcomes

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
