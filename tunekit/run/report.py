"""report.json of one tuned share: built in one place, whichever executor tuned it."""
from __future__ import annotations

import dataclasses
import os
import time

from ..atomic import write_json_atomic
from ..targets import target_dict


def tune_report(*, model: str, job, config, outcome, untuned: dict, tuned: dict, environment: dict, started: float,
                artifact: str, share_choice: dict, repaired_bytes: int) -> dict:
    """`outcome` is a clients.measurement.TuningOutcome; `untuned`/`tuned` are latency measurements."""
    report = {
        "model": os.path.abspath(model) if os.path.exists(model) else model, "share": job.label, "share_choice": share_choice,
        "target": target_dict(job.target),
        "trials": {"requested": config.trials if config.trials_bounded else None, "measured": outcome.trials_done, "failed": outcome.trials_failed,
                   "cached": outcome.trials_cached},
        "engine": outcome.engine, "phases": outcome.phases, "session_failures": outcome.session_failures,
        "latency_ms": {"untuned": untuned, "tuned": tuned,
                       "speedup": round(untuned["median_ms"] / tuned["median_ms"], 3)},
        "tasks": outcome.tasks, "fallback_tasks": sum(1 for t in outcome.tasks if t.get("fallback")),
        "tuning_wall_s": round(outcome.wall_s, 2), "wall_s": round(time.time() - started, 2),
        "server_restarts": outcome.server_restarts,
        "faults": {**outcome.faults, "records_repaired_bytes": repaired_bytes},
        "records_dir": job.db_dir, "artifact": artifact, "environment": {**environment, **outcome.environment},
        "config": dataclasses.asdict(config),
    }
    report.update(outcome.extra)  # e.g. the coordinator's clients, shards, fleets and pool
    return report


def write_report(report: dict, out_dir: str, *, name: str = "report.json") -> str:
    """Atomic: an interrupted run never leaves half a report."""
    return write_json_atomic(os.path.join(out_dir, name), report)
