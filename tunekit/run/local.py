"""The one-process executor: a share's fleet and tuning client in this process, no Ray."""
from __future__ import annotations

import contextlib

from ..clients.engine import Engine
from ..clients.measurement import FleetAddress, Measurement
from ..config import TuneConfig
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

    def groups(self, jobs: list[ShareJob]) -> list[list[ShareJob]]:
        return [[job] for job in jobs]

    @contextlib.contextmanager
    def group_sessions(self, group: list[ShareJob]):
        with contextlib.ExitStack() as stack:
            yield {job.label: stack.enter_context(ShareSession.for_tuning(job.share, self.config)) for job in group}

    def tune(self, group: list[ShareJob], sessions: dict, progress) -> dict:
        from ..records.database import open_database
        from ..servers.fleet import FleetConfig, RunnerFleet

        outcomes = {}
        for job in group:
            session = sessions[job.label]
            fleet_config = FleetConfig(servers=self.config.servers, server_mode=self.config.server_mode,
                                       host=self.config.listen_host, secret=self.rpc_secret, log_dir=job.log_dir)
            database = open_database(job.db_dir)
            with RunnerFleet(key=f"tunekit-{job.label}", pinned=session.pinned, config=fleet_config) as fleet:
                measurement = Measurement(
                    fleets=[FleetAddress(fleet_config.connect_host, fleet.tracker_port, fleet.key, self.config.servers,
                                         on_hang=fleet.stop_server_on_port)],
                    device_kind=job.share.kind, label=job.label, share_cores=session.pinned.cores,
                    share_env=session.pinned.env, secret=self.rpc_secret)
                outcome = self.engine.tune(tasks=job.tasks, target=job.target, database=database,
                                           work_dir=job.work_dir, measurement=measurement, config=self.config,
                                           progress=progress, records_dir=job.db_dir)
                outcome.server_restarts = fleet.restarts
                outcome.faults = {**fleet.fault_counts(), **outcome.faults}
            outcomes[job.label] = outcome
        return outcomes
