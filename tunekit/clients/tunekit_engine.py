"""tunekit's engine: persistent build workers, persistent RPC sessions, the pipelined search loop
with de-duplication and a per-phase time breakdown (clients.search_loop).

`make_engine` assembles its parts once; the one-process executor (TunekitEngine) and every Ray
tuning client use it, so both run the same engine with the same overlap rule.
"""
from __future__ import annotations

import logging
import os

from ..config import TuneConfig
from .measurement import Measurement, TuningOutcome, builder_cores, overlap_allowed, process_on

log = logging.getLogger("tunekit.engine")


class SearchEngine:
    """tunekit's engine, assembled: build pool, measuring runner, XGBoost cost model. Kept for the
    life of a client, so several search calls (the coordinator's leftover rounds) reuse them."""

    def __init__(self, *, builder, runner, cost_model, cores: list[int], overlap: bool):
        self.builder, self.runner, self.cost_model = builder, runner, cost_model
        self.cores, self.overlap = cores, overlap

    def search(self, request):
        """Run the search loop over `request` (a clients.search_loop.SearchRequest)."""
        from .search_loop import run_search

        return run_search(request, builder=self.builder, runner=self.runner, cost_model=self.cost_model,
                          search_threads=len(self.cores), overlap=self.overlap)

    def describe(self) -> dict:
        return {"overlap": self.overlap, "build_workers": self.builder.workers, "hung_candidates": self.runner.hangs,
                "build_profile": self.builder.profile.summary()}

    def shutdown(self) -> None:
        self.runner.shutdown()
        self.builder.shutdown()


def _runner_for(measurement: Measurement, config: TuneConfig):
    from .fanout_runner import FanoutRunner
    from .session_runner import RunnerConfig, SessionRunner

    runners = [SessionRunner(RunnerConfig(tracker_host=fleet.host, tracker_port=fleet.port, key=fleet.key,
                                          sessions=fleet.sessions, candidate_timeout_s=config.session_timeout_s,
                                          min_repeat_ms=config.min_repeat_ms,
                                          servers_gone_timeout_s=config.servers_gone_timeout_s,
                                          label=measurement.label or fleet.key.removeprefix("tunekit-"),
                                          release_idle_sessions=measurement.shared, secret=measurement.secret,
                                          measure_lock=config.measure_lock),
                             on_hang=fleet.on_hang)
               for fleet in measurement.fleets]
    return runners[0] if len(runners) == 1 else FanoutRunner(runners)


def make_engine(*, target, measurement: Measurement, config: TuneConfig, work_dir: str,
                cores: list[int] | None = None, build_workers: int | None = None) -> SearchEngine:
    """tunekit's engine for `target`, measuring on `measurement`'s fleets. `cores`: where building and
    searching may run (default: this process's cores, off a CPU share's cores when overlapping)."""
    from tvm.s_tir import meta_schedule as ms

    from .build_pool import BuildPool
    from .intrinsics import import_for_target, prepare_metaschedule_logging

    prepare_metaschedule_logging()
    import_for_target(target.kind.name)
    overlap = overlap_allowed(measurement.device_kind, config)
    cores = cores or builder_cores(measurement, overlap=overlap)
    builder = BuildPool(workers=build_workers or config.builder_workers or len(cores), timeout_s=config.build_timeout_s,
                        cores=cores, cuda_aot=target.kind.name == "cuda",
                        artifact_dir=os.path.join(work_dir, "artifacts"))
    runner = _runner_for(measurement, config)
    log.info("engine tunekit: %d build workers on cores %s, %d fleet(s), overlap %s",
             builder.workers, cores, len(measurement.fleets), overlap)
    return SearchEngine(builder=builder, runner=runner, cost_model=ms.cost_model.XGBModel(num_tuning_cores=len(cores)),
                        cores=cores, overlap=overlap)


class TunekitEngine:
    name = "tunekit"

    def tune(self, *, tasks, target, database, work_dir, measurement, config, progress,
             records_dir: str | None = None) -> TuningOutcome:
        """`records_dir`: the share's database dir, where the cost model is kept (clients.cost_model_store)."""
        from ..interrupts import cooperative
        from . import cost_model_store, warm_start
        from .search_loop import SearchRequest

        sources = warm_start.open_sources(config.warm_start)
        engine = make_engine(target=target, measurement=measurement, config=config, work_dir=work_dir)
        try:
            # Its own saved model first (a resumed run), else a warm start's.
            mine = [cost_model_store.model_path(records_dir)] if records_dir and config.resume else []
            found = [cost_model_store.model_path(d) for d in _record_dirs(config.warm_start)]
            model = cost_model_store.load_into(engine.cost_model, candidates=mine + found)
            with cooperative(), process_on(engine.cores):
                loop = engine.search(SearchRequest(extracted_tasks=tasks, target=target, database=database,
                                                   config=config, work_dir=work_dir, progress=progress,
                                                   measure_untuned=config.measure_untuned_tasks,
                                                   warm_start=sources))
            model["saved_to"] = cost_model_store.save(engine.cost_model, records_dir)
        finally:
            engine.shutdown()
        warm = {"sources": config.warm_start, "candidates_measured_again":
                sum(t.get("warm_started", 0) for t in loop.tasks)} if config.warm_start else None
        return TuningOutcome(loop.trials_done, loop.trials_failed, loop.wall_s, loop.tasks, engine=self.name,
                             trials_cached=loop.trials_cached, phases={**loop.phases, **engine.describe()},
                             session_failures=loop.session_failures, faults=engine.runner.fault_counts(),
                             extra={"cost_model": model, **({"warm_start": warm} if warm else {})})


def _record_dirs(dirs: list[str]) -> list[str]:
    from ..records.database import find_share_databases

    return [path for directory in dirs for path in find_share_databases(directory).values()]
