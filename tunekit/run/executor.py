"""The one seam between the tuning pipeline and where tuning runs.

The pipeline (run.pipeline) does everything around tuning exactly once: load the model, check the
out dir and the run's identity, measure the untuned model, apply the records, compile, measure
the tuned model, write the report. An executor does the tuning itself:
- `run.local.LocalExecutor`: one process, one share at a time, no Ray;
- `coordinator.executor.RayExecutor`: tuning clients sharded over Ray, fleets per share and device.
The pipeline never knows which (as Kernel Tuner's strategies never know their runner).
"""
from __future__ import annotations

import dataclasses

import os
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Protocol

from ..shares.share import Share


@dataclass
class ShareJob:
    """One share of one model to tune: everything an executor needs, prepared by the pipeline."""

    share: Share
    target: object      # tvm.target.Target
    prepared: object    # the Relax module the tasks were extracted from (records apply to it)
    tasks: list         # MetaSchedule ExtractedTasks that still need a schedule
    db_dir: str         # records-<share>: this share's database, and nobody else's
    out: str            # the run's out dir
    precision: str = "fp32"  # what the prepared module computes in (frontend.precision)
    task_shares: dict | None = None  # a fleet's {task name: the shares whose models have it}; None: every share
    task_models: dict | None = None  # a fleet's {task name: {model: its weight x the task's count in it}}
    # the tasks built as they are (fused attention) whose kernels of another kind are tried (clients.kernel_trials)
    fused_tasks: list = dataclasses.field(default_factory=list)

    @property
    def label(self) -> str:
        return self.share.label

    @property
    def work_dir(self) -> str:
        return os.path.join(self.out, "work")

    @property
    def log_dir(self) -> str:
        return os.path.join(self.out, "work", "logs")


class Executor(Protocol):
    name: str

    def connect(self) -> AbstractContextManager:
        """Everything the executor needs for the whole run (Ray: start or join a cluster)."""

    def recover(self, job: ShareJob) -> None:
        """After the identity check, before tuning: fold in what a killed earlier run left behind."""

    def measures_every_share(self, jobs: list[ShareJob]) -> bool:
        """Whether one search measures each candidate at every share of `jobs` (then they tune the same tasks)."""

    def groups(self, jobs: list[ShareJob]) -> list[list[ShareJob]]:
        """Shares tuned at the same time, in the order they run."""

    def progress_total(self, group: list[ShareJob]) -> int:
        """Trials the progress bar counts for a group (a search per share, or one for all)."""

    def group_sessions(self, group: list[ShareJob]) -> AbstractContextManager:
        """{share label: run.session.ShareSession} open while a group is measured and tuned."""

    def warm_up(self, group: list[ShareJob], sessions: dict) -> AbstractContextManager:
        """What tuning `group` needs, started while the pipeline compiles and times the untuned model.
        Yields an object whose `settle(job)` the pipeline calls before it times a model at `job`'s
        share (the warm-up must not disturb that timing); `tune` then takes over what was started."""

    def tune(self, group: list[ShareJob], sessions: dict, progress) -> dict:
        """Tune every job of `group` into its db_dir: {share label: clients.measurement.TuningOutcome}."""
