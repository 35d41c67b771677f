"""tunekit's engine: persistent build workers, persistent RPC sessions, the pipelined search loop
with de-duplication and a per-phase time breakdown (clients.search_loop).

`make_engine` assembles its parts once; the one-process executor (TunekitEngine) and every Ray
tuning client use it, so both run the same engine with the same overlap rule.
"""
from __future__ import annotations

import logging
import os

from ..config import TuneConfig
from .measurement import Measurement, ShareToMeasure, TuningOutcome, builder_cores, overlap_allowed, process_on

log = logging.getLogger("tunekit.engine")

# XGBoost's threads for the cost model. One: its training runs on the updater thread beside the search's
# threads and the build workers, and an OpenMP team on busy cores spins at its barriers; more threads
# gain nothing on a few hundred rows (benchmarks/RESULTS.md, "search contention").
COST_MODEL_THREADS = 1


def new_cost_model():
    """MetaSchedule's XGBoost cost model, on COST_MODEL_THREADS threads."""
    from tvm.s_tir import meta_schedule as ms

    return ms.cost_model.XGBModel(num_tuning_cores=COST_MODEL_THREADS)


class SearchEngine:
    """tunekit's engine, assembled: build pool, measuring runner, XGBoost cost model. Kept for the
    life of a client, so several search calls (the coordinator's leftover rounds) reuse them."""

    def __init__(self, *, builder, runner, cost_model, cores: list[int], overlap: bool,
                 share_cost_models: dict | None = None, measurement_cores: list[int] | None = None,
                 search_threads: int | None = None):
        self.builder, self.runner, self.cost_model = builder, runner, cost_model
        self.search_threads = search_threads or len(cores)  # the evolutionary search's threads (TuneContext)
        self.share_cost_models = share_cost_models or {}  # measure every share: the other shares' models
        self.cores, self.overlap = cores, overlap
        self.measurement_cores = measurement_cores  # where the servers run (None: not pinned)

    def search(self, request):
        """Run the search loop over `request` (a clients.search_loop.SearchRequest): its share's LoopOutcome."""
        return self.search_shares(request)[request.label]

    def search_shares(self, request) -> dict:
        """{share label: LoopOutcome}: `request`'s share and, measured alongside, its `other_shares`."""
        from .search_loop import run_search

        return run_search(request, builder=self.builder, runner=self.runner, cost_model=self.cost_model,
                          search_threads=self.search_threads, overlap=self.overlap,
                          share_cost_models=self.share_cost_models)

    def describe(self) -> dict:
        return {"overlap": self.overlap, "build_workers": self.builder.workers, "build_cores": list(self.cores),
                "search_threads": self.search_threads,
                "measurement_cores": self.measurement_cores, "hung_candidates": self.runner.hangs,
                "build_profile": self.builder.profile.summary()}

    def shutdown(self) -> None:
        self.runner.shutdown()
        self.builder.shutdown()


def _runner_for(measurement: Measurement, config: TuneConfig, *, measure_lock=None):
    """The runner over `measurement`'s fleets. `measure_lock` overrides config.measure_lock."""
    from .fanout_runner import FanoutRunner
    from .session_runner import RunnerConfig, SessionRunner

    runners = [SessionRunner(RunnerConfig(tracker_host=fleet.host, tracker_port=fleet.port, key=fleet.key,
                                          sessions=fleet.sessions, candidate_timeout_s=config.session_timeout_s,
                                          servers_gone_timeout_s=config.servers_gone_timeout_s,
                                          label=measurement.label or fleet.key.removeprefix("tunekit-"),
                                          release_idle_sessions=measurement.shared, secret=measurement.secret,
                                          measure_lock=config.measure_lock if measure_lock is None
                                          else measure_lock),
                             on_hang=fleet.on_hang)
               for fleet in measurement.fleets]
    return runners[0] if len(runners) == 1 else FanoutRunner(runners)


def _multi_share_runner(measurements: dict, config: TuneConfig):
    """One runner per share behind a MultiShareRunner (the first share's result is the primary one).
    Measurements at different shares take turns: on a GPU they would share its bandwidth and L2,
    and CPU shares overlap on their cores. A CPU share therefore takes the CPU's measurement lock
    here unless --measure-lock off."""
    from .multi_share import MultiShareRunner

    lock = None
    if next(iter(measurements.values())).device_kind == "cpu" and config.measure_lock == "auto":
        lock = True
    return MultiShareRunner({label: _runner_for(m, config, measure_lock=lock) for label, m in measurements.items()})


def make_engine(*, target, measurement: Measurement, config: TuneConfig, work_dir: str,
                cores: list[int] | None = None, build_workers: int | None = None,
                other_shares: dict | None = None, search_threads: int | None = None) -> SearchEngine:
    """tunekit's engine for `target`, measuring on `measurement`'s fleets. `cores`: where building and
    searching may run (default: this process's cores, off a CPU share's cores when overlapping).
    `other_shares`: {label: Measurement} of more shares every candidate is also measured at (each
    with its own cost model); `measurement` is then the first share's. `search_threads`: the
    evolutionary search's threads (default: one per core of `cores`)."""
    from .build_pool import BuildPool
    from ..metaschedule_env import import_for_target, prepare_metaschedule_logging

    prepare_metaschedule_logging()
    import_for_target(target.kind.name)
    overlap = overlap_allowed(measurement.device_kind, config)
    cores = cores or builder_cores(measurement, overlap=overlap)
    builder = BuildPool(workers=build_workers or config.builder_workers or len(cores), timeout_s=config.build_timeout_s,
                        cores=cores, cuda_aot=target.kind.name == "cuda",
                        artifact_dir=os.path.join(work_dir, "artifacts"))
    if other_shares:
        runner = _multi_share_runner({measurement.label: measurement, **other_shares}, config)
    else:
        runner = _runner_for(measurement, config)
    log.info("engine tunekit: %d build workers on cores %s, %d fleet(s), overlap %s%s",
             builder.workers, cores, len(measurement.fleets), overlap,
             f", measured at {', '.join([measurement.label, *other_shares])}" if other_shares else "")
    return SearchEngine(builder=builder, runner=runner, cost_model=new_cost_model(), cores=cores, overlap=overlap,
                        share_cost_models={label: new_cost_model() for label in other_shares or {}},
                        measurement_cores=measurement.share_cores, search_threads=search_threads)


class TunekitEngine:
    name = "tunekit"
    measures_every_share = True  # tune_shares: one search, each candidate measured at every share

    def start(self, *, target, measurements: dict[str, Measurement], work_dir, config) -> SearchEngine:
        """The engine's parts for `measurements` (the first share's builds the candidates), made before
        tuning starts: the executor warms them up while the pipeline times the untuned model, and
        shuts them down after tuning (tune / tune_shares with `engine=`)."""
        first, *others = measurements
        return make_engine(target=target, measurement=measurements[first], config=config, work_dir=work_dir,
                           other_shares={label: measurements[label] for label in others})

    def tune(self, *, tasks, target, database, work_dir, measurement, config, progress,
             records_dir: str | None = None, engine: SearchEngine | None = None,
             fused_tasks: list | None = None, task_models: dict | None = None) -> TuningOutcome:
        """`records_dir`: the share's database dir, where the cost model is kept (clients.cost_model_store).
        `engine`: parts made by `start` (the caller shuts them down), else made and shut down here."""
        share = ShareToMeasure(measurement.label, database, measurement, records_dir)
        return self.tune_shares(tasks=tasks, target=target, shares=[share], work_dir=work_dir, config=config,
                                progress=progress, engine=engine, fused_tasks=fused_tasks,
                                task_models=task_models)[share.label]

    def tune_shares(self, *, tasks, target, shares: list[ShareToMeasure], work_dir, config,
                    progress, engine: SearchEngine | None = None,
                    task_shares: dict | None = None, fused_tasks: list | None = None,
                    task_models: dict | None = None) -> dict[str, TuningOutcome]:
        """One search for every share in `shares`: each candidate built once, measured at every share (or, with
        `task_shares` {task name: share labels}, at the shares that want its task), recorded in each share's
        database with the time measured there. The first share's target builds the candidates. `fused_tasks`: tasks
        built as they are, whose kernels of another kind are tried (clients.kernel_trials). `task_models`: a fleet's
        {task name: {model: its weight x the task's count in it}} (config.fleet_objective)."""
        from ..interrupts import cooperative
        from . import cost_model_store, warm_start
        from .search_loop import SearchRequest

        first, others = shares[0], shares[1:]
        owned = engine is None
        if owned:
            engine = self.start(target=target, measurements={s.label: s.measurement for s in shares},
                                work_dir=work_dir, config=config)
        try:
            # After make_engine: a CUDA record names tensor intrinsics (wmma_*), which it registers.
            sources = warm_start.open_sources(config.warm_start)
            models = {s.label: (engine.cost_model if s is first else engine.share_cost_models[s.label])
                      for s in shares}
            loaded = {s.label: _load_cost_model(models[s.label], s.records_dir, config) for s in shares}
            with cooperative(), process_on(engine.cores):
                loops = engine.search_shares(SearchRequest(
                    extracted_tasks=tasks, target=target, database=first.database, config=config, work_dir=work_dir,
                    progress=progress, warm_start=sources, fused_tasks=list(fused_tasks or []),
                    label=first.label, other_shares={s.label: s.database for s in others}, task_shares=task_shares,
                    task_models=task_models,
                    records_dirs={s.label: s.records_dir for s in shares} if all(s.records_dir for s in shares)
                    else {}))
            for s in shares:
                loaded[s.label]["saved_to"] = cost_model_store.save(models[s.label], s.records_dir)
        finally:
            if owned:
                engine.shutdown()
        faults = engine.runner.fault_counts()
        return {s.label: self._outcome(loops[s.label], engine, config, faults=faults,
                                       extra={"cost_model": loaded[s.label],
                                              **({"measured_with": [x.label for x in shares]} if others else {})})
                for s in shares}

    def _outcome(self, loop, engine, config, *, faults: dict, extra: dict) -> TuningOutcome:
        warm = {"sources": config.warm_start, "candidates_measured_again":
                sum(t.get("warm_started", 0) for t in loop.tasks)} if config.warm_start else None
        return TuningOutcome(loop.trials_done, loop.trials_failed, loop.wall_s, loop.tasks, engine=self.name,
                             trials_cached=loop.trials_cached, phases={**loop.phases, **engine.describe()},
                             session_failures=loop.session_failures, faults=faults,
                             extra={**extra, **({"warm_start": warm} if warm else {})})


def _load_cost_model(model, records_dir: str | None, config) -> dict:
    """Its own saved model first (a resumed run), else a warm start's (clients.cost_model_store)."""
    from . import cost_model_store

    mine = [cost_model_store.model_path(records_dir)] if records_dir and config.resume else []
    found = [cost_model_store.model_path(d) for d in _record_dirs(config.warm_start)]
    return cost_model_store.load_into(model, candidates=mine + found)


def _record_dirs(dirs: list[str]) -> list[str]:
    from ..records.database import find_share_databases

    return [path for directory in dirs for path in find_share_databases(directory).values()]
