"""tunekit's tuning loop: MetaSchedule's search, driven from Python so the system around it is fast.

`ms.tune_tasks` runs search -> build -> measure strictly in turn and re-measures candidates the
database already holds on resume. This loop drives the same TuneContexts (evolutionary search,
XGBoost cost model, database) but:
- pipelines: while batch N is built (on the build pool) and measured (on the servers), batch N+1
  (another task) is searched; it only does so when the builders do not share cores with the
  share being measured;
- never measures a candidate twice: a candidate whose trace is already in the database (this run
  or a run being resumed) is answered from the record;
- commits every measured trial to the database as it completes;
- times every phase (search, build, load, run, wait) so the report shows where the time goes;
- measures each task once untuned (the naive loop nest on CPU, DLight's default on GPU).
"""
from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field

from ..config import TuneConfig
from ..interrupts import stop_requested
from ..records.baselines import workload_key
from ..records.database import FAILED_RUN_SECS, commit_durably, commit_workload_durably
from ..records.database import mean_run_us as _us

log = logging.getLogger("tunekit.search")



@dataclass
class PhaseTimes:
    search_s: float = 0.0  # generating candidates (evolutionary search + cost model), main thread
    build_s: float = 0.0   # the stage thread building batches (parallel workers); overlaps search
    load_s: float = 0.0    # summed over candidates: upload + dlopen on the server
    run_s: float = 0.0     # summed over candidates: argument fill + timing on the server
    wait_s: float = 0.0    # main thread blocked on a batch (its build or its measurements)
    update_s: float = 0.0  # database commits, cost-model training, search-state updates

    def as_dict(self, wall_s: float, trials: int) -> dict:
        phases = {k: round(v, 3) for k, v in self.__dict__.items()}
        # "Work" is what the hardware must do anyway: building candidates and running them.
        work = min(wall_s, self.build_s + self.run_s)
        return {"total_s": phases, "per_trial_s": {k: round(v / max(1, trials), 4) for k, v in self.__dict__.items()},
                "wall_s": round(wall_s, 3), "overhead_fraction": round(1 - work / wall_s, 3) if wall_s else None}


@dataclass
class _Task:
    index: int
    name: str
    weight: float
    ctx: object
    workload: object
    measured: int = 0
    failed: int = 0
    cached: int = 0
    best_us: float | None = None
    untuned_us: float | None = None
    stale_batches: int = 0
    exhausted: bool = False
    cap: int = 0      # trials this task may measure (its budget, plus what it took from the pool)
    budget: int = 0   # its budget as planned
    extra: int = 0    # taken from the shared pool
    resumed: int = 0  # trials already in this client's database when the call began (count_existing)
    seen: dict = field(default_factory=dict)  # trace key -> run_secs already in the database

    @property
    def effective_us(self) -> float | None:
        """What this task costs in the compiled model: its best record, unless the untuned kernel is
        faster (then the record is not applied; see clients.compiler)."""
        known = [us for us in (self.best_us, self.untuned_us) if us is not None]
        return min(known) if known else None

    def score(self) -> float:
        # Expected gain ~ the time this task takes in the model (weight x latency), fading while the
        # task stops improving. The untuned baseline gives every task a latency before its first
        # batch, so trials go to the heavy kernels first instead of round-robin from the first task.
        latency = self.effective_us if self.effective_us is not None else float("inf")
        return self.weight * latency * (0.5 ** self.stale_batches)


@dataclass
class _Batch:
    task: _Task
    candidates: list
    keys: list[str]
    fresh: list[int]   # indices of candidates to build and measure
    cached: list[int]  # indices of candidates already in the database (answered from the record)
    staged: concurrent.futures.Future | None = None  # -> (build results, run futures by slot, build s)


@dataclass
class LoopOutcome:
    trials_done: int
    trials_failed: int
    trials_cached: int
    wall_s: float
    tasks: list[dict]
    phases: dict
    session_failures: int


def trace_key(trace) -> str:
    """Identity of a candidate: its trace with every sampling decision (postprocs excluded)."""
    text = json.dumps(trace.as_json(remove_postproc=True), sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()


def _records_by_workload(database) -> dict:
    seen: dict = {}
    for record in database.get_all_tuning_records():
        secs = [float(s) for s in (record.run_secs or [])]
        seen.setdefault(record.workload.mod, {})[trace_key(record.trace)] = secs
    return seen


def _untuned_module(ctx, target):
    """The task as the untuned model runs it: naive loops on CPU, DLight's default schedule on GPU."""
    if target.kind.name != "cuda":
        return ctx.mod
    import tvm
    from tvm.s_tir import dlight as dl

    # On a private copy: DLight schedules the PrimFuncs in place, and ctx.mod is also the workload
    # in the database. Scheduling it changed the workload's structure, so MetaScheduleApplyDatabase
    # in this process matched none of the records (seen on the H100: tuned model == untuned model).
    private = tvm.ir.load_json(tvm.ir.save_json(ctx.mod))
    with target:
        return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                       dl.gpu.GeneralReduction(), dl.gpu.Fallback())(private)


def run_search(*, extracted_tasks, target, database, builder, runner, cost_model, config: TuneConfig,
               search_threads: int, work_dir: str, overlap: bool, progress=None,
               measure_untuned: bool = True, task_budgets: list[int] | None = None, pool=None,
               known_database=None, count_existing: bool = False, improving_only: bool = True,
               tag: dict | None = None) -> LoopOutcome:
    """Tune `extracted_tasks` within `config.trials` (shared by the tasks, by score).

    For the coordinator's clients: `task_budgets` gives each task its own budget instead; a task
    whose space runs out gives its unused trials to `pool`, and a task that spent its budget and
    still improves (any task, with improving_only=False) takes more from it. `known_database`
    holds earlier runs' records (never re-measured); with `count_existing`, trials already in
    `database` count against the budgets (a restarted client resumes its shard)."""
    import tvm_ffi
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.runner import RunnerInput, RunnerResult

    from .session_runner import is_not_measured

    started = time.perf_counter()
    phases = PhaseTimes()
    # extracted_tasks_to_tune_contexts skips already-scheduled tasks: keep the two lists aligned.
    keep = [i for i, t in enumerate(extracted_tasks) if not t.mod.attrs.get("tirx.is_scheduled", False)]
    extracted_tasks = [extracted_tasks[i] for i in keep]
    if task_budgets is not None:
        task_budgets = [task_budgets[i] for i in keep]
    strategy = ms.search_strategy.EvolutionarySearch(population_size=config.population,
                                                     genetic_num_iters=config.genetic_iters_for(target.kind.name),
                                                     init_min_unmeasured=config.init_samples_for(target.kind.name))
    contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
        extracted_tasks, work_dir, strategy=strategy, num_threads=search_threads, seed=config.seed)
    known = _records_by_workload(database)
    mine = {mod: len(secs) for mod, secs in known.items()} if count_existing else {}
    if known_database is not None:
        for mod, secs in _records_by_workload(known_database).items():
            known.setdefault(mod, {}).update(secs)
    tasks: list[_Task] = []
    t0 = time.perf_counter()
    for i, (extracted, ctx, weight) in enumerate(zip(extracted_tasks, contexts, weights)):
        ctx.pre_tuning(max_trials=config.trials if task_budgets is None else 1 << 30,
                       num_trials_per_iter=config.trials_per_iter,
                       design_spaces=ctx.generate_design_space(), database=database, cost_model=cost_model)
        workload = commit_workload_durably(database, ctx.mod)
        seen = next((secs for mod, secs in known.items() if tvm_ffi.structural_equal(mod, ctx.mod)), {})
        task = _Task(i, extracted.task_name, float(weight), ctx, workload, seen=dict(seen))
        task.budget = task.cap = config.trials if task_budgets is None else int(task_budgets[i])
        task.measured = next((n for mod, n in mine.items() if tvm_ffi.structural_equal(mod, ctx.mod)), 0)
        task.resumed = task.measured
        bests = [us for us in map(_us, seen.values()) if us is not None]
        task.best_us = min(bests) if bests else None
        tasks.append(task)
    phases.search_s += time.perf_counter() - t0
    device_type = "cuda" if target.kind.name == "cuda" else "cpu"
    budget = config.trials

    if measure_untuned:
        _measure_untuned(tasks, target, builder, runner, device_type, phases)

    def pick(busy: set[int]) -> _Task | None:
        open_tasks = [t for t in tasks if not t.exhausted and t.index not in busy and t.measured < t.cap]
        if open_tasks or pool is None:
            return max(open_tasks, key=_Task.score, default=None)
        # Every task spent its budget: the best one that still improves asks the pool for more.
        hopeful = [t for t in tasks if not t.exhausted and t.index not in busy
                   and (t.stale_batches == 0 or not improving_only)]
        best = max(hopeful, key=_Task.score, default=None)
        if best is not None:
            granted = pool.take(config.trials_per_iter)
            best.cap += granted
            best.extra += granted
            return best if granted else None
        return None

    def release_unused(task: _Task) -> None:
        if pool is not None and task.cap > task.measured:
            pool.release(task.cap - task.measured)
            task.cap = task.measured

    def propose(task: _Task, remaining: int) -> _Batch | None:
        """Search: one batch of candidates for `task` (main thread; MetaSchedule's C++ search
        releases the GIL, so the stage thread keeps building and measuring meanwhile)."""
        t = time.perf_counter()
        candidates = task.ctx.generate_measure_candidates()
        if not candidates:
            task.exhausted = True
            release_unused(task)
            phases.search_s += time.perf_counter() - t
            return None
        keys = [trace_key(c.sch.trace) for c in candidates]
        fresh = [j for j, k in enumerate(keys) if k not in task.seen][:remaining]
        cached = [j for j, k in enumerate(keys) if k in task.seen]
        phases.search_s += time.perf_counter() - t
        return _Batch(task, candidates, keys, fresh, cached)

    def build_and_submit(batch: _Batch):
        """Stage thread: build the batch's fresh candidates, hand the built ones to the runner."""
        t = time.perf_counter()
        build_results = builder.build([BuilderInput(batch.candidates[j].sch.mod, target) for j in batch.fresh]) \
            if batch.fresh else []
        build_s = time.perf_counter() - t
        inputs, input_slots = [], []
        for slot, (j, built) in enumerate(zip(batch.fresh, build_results)):
            if built.error_msg is None:
                inputs.append(RunnerInput(built.artifact_path, device_type, batch.candidates[j].args_info))
                input_slots.append(slot)
        futures = runner.run(inputs) if inputs else []
        return build_results, dict(zip(input_slots, futures)), build_s

    def join(batch: _Batch) -> int:
        task, candidates, keys, fresh, cached = batch.task, batch.candidates, batch.keys, batch.fresh, batch.cached
        t = time.perf_counter()
        build_results, futures, build_s = batch.staged.result() if batch.staged is not None else ([], {}, 0.0)
        phases.build_s += build_s
        run_results = []
        for slot, built in enumerate(build_results):
            if slot in futures:
                run_results.append(futures[slot].result())
            else:
                run_results.append(RunnerResult(None, built.error_msg or "build failed"))
        phases.wait_s += time.perf_counter() - t
        t = time.perf_counter()
        previous = task.effective_us
        ok_candidates, ok_results = [], []
        for j, built, result in zip(fresh, build_results, run_results):
            timing = getattr(runner, "timings", {}).pop(str(built.artifact_path), None) if built.artifact_path else None
            if timing is not None:
                phases.load_s += timing.load_s
                phases.run_s += timing.run_s
            if built.artifact_path and os.path.exists(str(built.artifact_path)):
                os.remove(str(built.artifact_path))
            if is_not_measured(result):
                continue  # never ran (the runner gave up on the share's servers): not a trial, not recorded
            secs = [float(s) for s in result.run_secs] if result.run_secs is not None else [FAILED_RUN_SECS]
            # Durable as it completes: appended and fsynced, one line per trial.
            commit_durably(database, ms.database.TuningRecord(
                candidates[j].sch.trace, task.workload, secs, target, candidates[j].args_info))
            task.seen[keys[j]] = secs
            task.measured += 1
            us = _us(secs)
            if us is None:
                task.failed += 1
            else:
                ok_candidates.append(candidates[j])
                ok_results.append(result)
                if task.best_us is None or us < task.best_us:
                    task.best_us = us
        if getattr(runner, "fatal", None) is not None:
            raise runner.fatal  # every server of the share gone: stop, with what was measured recorded
        if ok_candidates:
            cost_model.update(task.ctx, ok_candidates, ok_results)
        # The search strategy hears about every candidate it proposed, the cached ones included.
        notified = [candidates[j] for j in fresh] + [candidates[j] for j in cached]
        notify_results = run_results + [RunnerResult(task.seen[keys[j]], None) for j in cached]
        task.cached += len(cached)
        task.ctx.notify_runner_results(notified, notify_results)
        now = task.effective_us
        improved = now is not None and (previous is None or now < previous * 0.99)
        task.stale_batches = 0 if improved else task.stale_batches + 1
        if not fresh and cached:
            task.stale_batches += 1  # the search keeps proposing known candidates: it has converged
        phases.update_s += time.perf_counter() - t
        if pool is not None:
            pool.report(len(fresh), task.name, task.best_us)
        if progress is not None:
            progress.advance(len(fresh), status=f"{task.name[:28]} best {task.best_us:.1f} us"
                             if task.best_us else task.name[:28])
        return len(fresh)

    # Batches go through three stages: search (this thread), build (the stage thread, on the
    # build pool) and measure (the runner's sessions). With overlap, the next task is searched
    # while earlier batches are built and measured, so the wall tends to the slowest stage
    # instead of their sum; without it (CPU builders sharing the measured cores) one at a time.
    depth = 2 if overlap else 1
    stage = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunekit-build")
    in_flight: collections.deque[_Batch] = collections.deque()
    done = 0
    idle_rounds = 0
    exhausted = False
    try:
        while True:
            if stop_requested():
                exhausted = True  # Ctrl-C: launch nothing more, still collect the batches in flight
            remaining = budget - done - sum(len(b.fresh) for b in in_flight)
            if task_budgets is not None:
                remaining = 1  # per-task budgets: the task's own cap limits the batch (below)
            task = None
            if remaining > 0 and not exhausted and len(in_flight) < depth:
                task = pick({b.task.index for b in in_flight})
            if task is not None:
                batch = propose(task, min(remaining, task.cap - task.measured) if task_budgets is None
                                else task.cap - task.measured)
                if batch is None:
                    continue
                if not batch.fresh and batch.cached:
                    # All candidates were known: no trial spent, but the search must hear back.
                    join(batch)
                    idle_rounds += 1
                    # Every task keeps proposing known candidates: the space is exhausted. Stop
                    # launching, but still collect the batches in flight.
                    exhausted = idle_rounds > 4 * len(tasks)
                    continue
                idle_rounds = 0
                batch.staged = stage.submit(build_and_submit, batch)
                in_flight.append(batch)
                continue
            if not in_flight:
                break
            done += join(in_flight.popleft())
    finally:
        stage.shutdown(wait=not in_flight, cancel_futures=True)
    for task in tasks:
        task.ctx.post_tuning()
        if not stop_requested():
            release_unused(task)  # e.g. the search kept proposing known candidates

    wall = time.perf_counter() - started
    measured = sum(t.measured for t in tasks)
    task_rows = [{"name": t.name, "workload_hash": workload_key(t.ctx.mod), "weight": int(t.weight),
                  "trials": t.measured, "failed": t.failed, **({"resumed": t.resumed} if t.resumed else {}),
                  "cached": t.cached, "untuned_us": round(t.untuned_us, 3) if t.untuned_us else None,
                  "tuned_us": round(t.best_us, 3) if t.best_us else None,
                  "speedup": round(t.untuned_us / t.best_us, 3) if t.untuned_us and t.best_us else None,
                  **({"budget": t.budget, "extra": t.extra, "exhausted": t.exhausted, **(tag or {})}
                     if task_budgets is not None else {})}
                 for t in tasks]
    return LoopOutcome(measured, sum(t.failed for t in tasks), sum(t.cached for t in tasks), wall, task_rows,
                       phases.as_dict(wall, measured), getattr(runner, "session_failures", 0))


def _measure_untuned(tasks, target, builder, runner, device_type, phases) -> None:
    """One build + run per task of the unscheduled (or default-scheduled) kernel: the per-task baseline."""
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    inputs, owners = [], []
    for task in tasks:
        try:
            mod = _untuned_module(task.ctx, target)
        except Exception as exc:  # a task no default rule covers: no baseline for it
            log.info("no untuned baseline for %s: %s", task.name, exc)
            continue
        inputs.append(BuilderInput(mod, target))
        owners.append(task)
    t = time.perf_counter()
    built = builder.build(inputs)
    phases.build_s += time.perf_counter() - t
    run_inputs, run_owners = [], []
    for task, result, inp in zip(owners, built, inputs):
        if result.error_msg is None:
            func = next(iter(inp.mod.functions.values()))
            run_inputs.append(RunnerInput(result.artifact_path, device_type, ArgInfo.from_prim_func(func)))
            run_owners.append((task, str(result.artifact_path)))
    t = time.perf_counter()
    for (task, path), future in zip(run_owners, runner.run(run_inputs)):
        task.untuned_us = _us(future.result().run_secs)
        getattr(runner, "timings", {}).pop(path, None)
        if os.path.exists(path):
            os.remove(path)
    phases.wait_s += time.perf_counter() - t
