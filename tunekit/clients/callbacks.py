"""What happens to a measured candidate: the counterparts of MetaSchedule's `measure_callback/`
(AddToDatabase, RemoveBuildArtifact, UpdateCostModel), called by tunekit's search loop."""
from __future__ import annotations

import os

from ..records.database import FAILED_RUN_SECS
from ..records.tuning_database import commit_durably


def remove_artifact(path) -> None:
    """A built candidate's library (and what its check reads beside it) is not needed once it has been measured (or
    failed)."""
    from .session_runner import written_args_path

    if path:
        for name in (str(path), written_args_path(path)):
            if os.path.exists(name):
                os.remove(name)


def run_secs_of(result) -> list[float]:
    """What the database records for a runner result: its times, or MetaSchedule's failure value."""
    return [float(s) for s in result.run_secs] if result.run_secs is not None else [FAILED_RUN_SECS]


def add_to_database(database, *, task, candidate, secs: list[float], target,
                    key: tuple[str, bool] | None = None) -> None:
    """Durable as it completes: appended and fsynced, one line per trial (records.tuning_database).
    `key`: the candidate's (trace key, tensorized), which the loop already has."""
    from tvm.s_tir import meta_schedule as ms

    commit_durably(database, ms.database.TuningRecord(candidate.sch.trace, task.workload, secs, target,
                                                      candidate.args_info), key=key)


def update_cost_model(cost_model, *, task, candidates: list, results: list) -> None:
    """Train the cost model on the candidates that ran (failed ones teach it nothing useful)."""
    if candidates:
        cost_model.update(task.ctx, candidates, results)
