"""Tuning engines: what turns a share's tasks and servers into records.

- "tunekit" (default): clients.tunekit_engine, tunekit's fast engine;
- "stock": clients.stock_engine, `ms.tune_tasks` with `LocalBuilder` and `RPCRunner` exactly as
  TVM ships them: the baseline the benchmark compares against.

`Engine.create(kind)` takes a name or an engine object, as MetaSchedule's `Runner.create` does.
"""
from __future__ import annotations

from typing import Protocol

from ..config import TuneConfig
from ..errors import TunekitError
from .measurement import Measurement, TuningOutcome
from .stock_engine import StockEngine
from .tunekit_engine import TunekitEngine

ENGINES = {"tunekit": TunekitEngine, "stock": StockEngine}


class Engine(Protocol):
    """Tunes a share's tasks on its fleet(s) into `database`."""

    name: str

    def tune(self, *, tasks, target, database, work_dir: str, measurement: Measurement, config: TuneConfig,
             progress, records_dir: str | None = None, fused_tasks: list | None = None,
             task_models: dict | None = None) -> TuningOutcome:
        """`fused_tasks`: tasks built as they are (fused attention); an engine may try kernels of another kind for
        them (the tunekit engine does: clients.kernel_trials). `task_models`: a fleet's {task name: {model: units}}
        (the tunekit engine weighs them by config.fleet_objective)."""
        ...

    @staticmethod
    def create(kind: "str | Engine") -> "Engine":
        if not isinstance(kind, str):
            return kind  # an engine object: used as it is
        if kind not in ENGINES:
            raise TunekitError(f"engine must be one of {', '.join(ENGINES)}, not {kind!r}")
        return ENGINES[kind]()
