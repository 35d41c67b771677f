"""tunekit's tuning loop: MetaSchedule's search, driven from Python so the system around it is fast.

`ms.tune_tasks` runs search -> build -> measure strictly in turn and re-measures candidates the
database already holds on resume. This loop drives the same TuneContexts (evolutionary search,
XGBoost cost model, database) but:
- pipelines: while batch N is built (on the build pool) and measured (on the servers), batch N+1
  (another task, or the same task from what its last search picked) is searched and its builds
  start; it only does so when the builders do not share cores with the share being measured;
- streams: each candidate goes to a runner as soon as it is built, not when its batch is;
- never measures a candidate twice: a candidate whose trace is already in the database (this run
  or a run being resumed) is answered from the record;
- commits every measured trial to the database as it completes (clients.callbacks);
- times every phase (search, build, load, run, wait) so the report shows where the time goes;
- measures each task once untuned (the naive loop nest on CPU, DLight's default on GPU);
- with several shares (measure every share), builds each candidate once and measures it at every
  share: each share has its own TuneContexts, database and cost model, and the shares take turns
  searching a task, so every share's search steers the one stream of candidates. A share's picks
  are all spent before the next share searches the task, so each search has seen every batch
  measured before it, as a search for one share alone does (see SearchLoop._propose).
Which task goes next is clients.scheduler's decision (over the first share's view of the tasks).
"""
from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import logging
import time
from dataclasses import dataclass, field

from ..config import TuneConfig
from ..errors import error_line
from ..interrupts import stop_requested
from ..records.baselines import workload_key
from ..frontend.tasks import already_scheduled, task_bytes, task_family, task_flops
from ..records.database import mean_run_us
from ..records.trace_keys import TENSORIZE_MARK, key_and_mark, trace_key, trace_text
from ..records.tuning_database import commit_workload_durably, known_traces
from . import callbacks, first_look, task_faults
from ..metaschedule_env import prepare_metaschedule_logging
from .design_spaces import draw_at_once
from .scheduler import TaskScheduler, TaskState, fleet_priorities, mark_negligible

log = logging.getLogger("tunekit.search")

# A task whose first batches all failed (every candidate, in this many batches) stops being tuned and keeps its
# untuned kernel: its trials go to the rest of the model.
FAILING_BATCHES = 3
UNLIMITED_TRIALS = 1 << 30  # the search strategy's own trial limit: never reached (start_search)


@dataclass
class PhaseTimes:
    search_s: float = 0.0  # generating candidates (evolutionary search + cost model)
    build_s: float = 0.0   # stage threads building batches (parallel workers), summed; overlaps search
    load_s: float = 0.0    # summed over candidates: upload + dlopen on the server
    run_s: float = 0.0     # summed over candidates: argument fill + timing on the server
    wait_s: float = 0.0    # main thread blocked on a batch (its build or its measurements)
    update_s: float = 0.0  # database commits and search-state updates
    model_s: float = 0.0   # cost-model training on its own thread (overlaps search, build and measurement)
    lock_wait_s: float = 0.0  # summed over candidates: waiting for the device's measurement lock
    kernels_s: float = 0.0  # building, checking and timing kernels of another kind (clients.kernel_trials)

    def as_dict(self, wall_s: float, trials: int) -> dict:
        phases = {k: round(v, 3) for k, v in self.__dict__.items()}
        # "Work" is what the hardware must do anyway: building candidates and running them.
        work = min(wall_s, self.build_s + self.run_s)
        return {"total_s": phases, "per_trial_s": {k: round(v / max(1, trials), 4) for k, v in self.__dict__.items()},
                "wall_s": round(wall_s, 3), "overhead_fraction": round(1 - work / wall_s, 3) if wall_s else None}


@dataclass
class _Batch:
    task: TaskState
    candidates: list
    keys: list[str]
    fresh: list[int]   # indices of candidates to build and measure
    cached: list[int]  # indices of candidates already in the database (answered from the record)
    staged: concurrent.futures.Future | None = None  # -> (build results, run futures by slot, build s)
    proposers: list[int] = field(default_factory=list)  # per candidate, the share whose search picked it
                                                        # (ShareLane index); empty: all the first share's

    def proposer(self, j: int) -> int:
        return self.proposers[j] if self.proposers else 0


@dataclass
class LoopOutcome:
    trials_done: int
    trials_failed: int
    trials_cached: int
    wall_s: float
    tasks: list[dict]
    phases: dict
    session_failures: int


@dataclass
class SearchRequest:
    """One call of the loop: the tasks and where their trials go, besides the engine's parts.

    For the coordinator's clients: `task_budgets` gives each task its own budget instead of the
    global `config.trials`; a task whose space runs out gives its unused trials to `pool`, and a
    task that spent its budget and still improves (any task, with improving_only=False) takes
    more from it. `known_database` holds earlier runs' records (never re-measured); with
    `count_existing`, trials already in `database` count against the budgets (a restarted
    client resumes its shard). `tag` is added to every task row of the report."""

    extracted_tasks: list
    target: object
    database: object
    config: TuneConfig
    work_dir: str
    progress: object = None
    measure_untuned: bool = True
    task_budgets: list[int] | None = None
    pool: object = None
    known_database: object = None
    count_existing: bool = False
    improving_only: bool = True
    tag: dict = field(default_factory=dict)
    warm_start: list = field(default_factory=list)  # opened databases of other runs (clients.warm_start)
    label: str = ""     # the share `database` belongs to
    # Measure every share: {share label: its database} of the other shares each candidate is also
    # measured at (the runner is then a clients.multi_share.MultiShareRunner, this share first).
    other_shares: dict = field(default_factory=dict)
    # {task name: the share labels that want it}: a fleet's task is searched and measured only at the shares of
    # the models that have its workload. None, or a task not named: every share.
    task_shares: dict | None = None
    # {share label: its database dir} of every share: GEMM tasks also try Triton kernels, kept in each share's kernel
    # records (clients.kernel_trials). Empty: MetaSchedule's kernels only.
    records_dirs: dict = field(default_factory=dict)
    # the tasks built as they are (fused attention, never searched) whose kernels of another kind are tried too
    fused_tasks: list = field(default_factory=list)
    # a fleet's {task name: {model: its weight x the task's count in it}}: config.fleet_objective weighs the models
    task_models: dict | None = None


@dataclass
class ShareLane:
    """One share of the run as the search sees it: its database, its cost model, its own view of the
    tasks (TuneContexts whose search reads this share's records) and the candidates its searches picked."""

    label: str
    database: object
    cost_model: object
    tasks: list = field(default_factory=list)
    proposed: int = 0


def _find(table: dict, mod, default):
    """table[mod] by structural equality (what the database's own lookup uses)."""
    import tvm_ffi

    return next((v for k, v in table.items() if tvm_ffi.structural_equal(k, mod)), default)


def _load_known(state: TaskState, found: dict) -> None:
    """What the databases already hold for this task: never measured again, and its best is the start."""
    state.seen = {key: secs for key, (secs, _) in found.items()}
    state.tensorized = {key for key, (_, tensorized) in found.items() if tensorized}
    bests = [(us, key) for key, us in ((k, mean_run_us(s)) for k, s in state.seen.items()) if us is not None]
    if bests:
        state.best_us, state.best_key = min(bests)


def start_search(ctx, *, picks: int, design_spaces, database, cost_model) -> None:
    """`ctx.pre_tuning` for the loop: `picks` candidates per search, and no trial limit of MetaSchedule's own. The loop
    keeps the budget; MetaSchedule counts its trials from what it is notified of, known candidates included, and
    with the budget as its limit a search that had met one known candidate stopped the run a trial short."""
    ctx.pre_tuning(max_trials=UNLIMITED_TRIALS, num_trials_per_iter=picks, design_spaces=design_spaces,
                   database=database, cost_model=cost_model)


def untuned_module(ctx, target):
    """The task as the untuned model runs it: naive loops on CPU, DLight's default schedule on GPU."""
    if target.kind.name != "cuda":
        return ctx.mod
    import tvm
    from tvm.s_tir import dlight as dl

    # On a private copy: DLight schedules the PrimFuncs in place, and ctx.mod is also the workload
    # in the database. Scheduling it changed the workload's structure, so MetaScheduleApplyDatabase
    # in this process matched none of the records, and the tuned model came out untuned.
    private = tvm.ir.load_json(tvm.ir.save_json(ctx.mod))
    with target:
        return dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                       dl.gpu.GeneralReduction(), dl.gpu.Fallback())(private)


def search_contexts(tasks: list, target, work_dir: str, *, config: TuneConfig, threads: int) -> tuple[list, list]:
    """(TuneContexts, weights) of `tasks` with tunekit's evolutionary search settings and seed."""
    from tvm.s_tir import meta_schedule as ms

    kind = target.kind.name
    strategy = ms.search_strategy.EvolutionarySearch(population_size=config.population,
                                                     genetic_num_iters=config.genetic_iters_for(kind),
                                                     init_min_unmeasured=config.init_samples_for(kind))
    prepare_metaschedule_logging()  # every set of TuneContexts: MetaSchedule's console stays quiet
    return ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, work_dir, strategy=strategy,
                                                                 num_threads=threads, seed=config.seed)


class SearchLoop:
    """Batches go through three stages: search, build (the stage thread, on the build pool) and measure
    (the runner's sessions). With overlap, the next task is searched while earlier batches are built
    and measured, so the wall tends to the slowest stage instead of their sum. Without overlap (CPU
    builders sharing the measured cores) one batch at a time."""

    def __init__(self, request: SearchRequest, *, builder, runner, cost_model, search_threads: int, overlap: bool,
                 share_cost_models: dict | None = None):
        """`share_cost_models`: {label: cost model} of `request.other_shares` (measure every share)."""
        self.req = request
        self.builder, self.runner, self.cost_model = builder, runner, cost_model
        self.search_threads = search_threads
        self.depth = request.config.pipeline_depth_for(request.target.kind.name) if overlap else 1
        self.most_in_flight = 0  # the most batches that were in flight at once (report: phases.pipeline)
        self.sent_ahead = 0  # batches sent from a task's reserve while a batch of it was in flight
        # batch-seconds in flight over the loop: their mean says how full the pipeline was kept, which a client
        # with fewer open tasks than `depth` cannot fill (a task has one batch in flight at a time)
        self._in_flight_s, self._in_flight_count, self._in_flight_since = 0.0, 0, None
        self._loop_s = 0.0
        self.phases = PhaseTimes()
        self.device_type = "cuda" if request.target.kind.name == "cuda" else "cpu"
        self.lanes = [ShareLane(request.label, request.database, cost_model)] + [
            ShareLane(label, database, (share_cost_models or {})[label])
            for label, database in request.other_shares.items()]
        self._pre_tuned: list = []  # the TuneContexts whose search was set up (post_tuning at the end)
        for lane in self.lanes:
            lane.tasks = self._make_tasks(lane, first=lane is self.lanes[0])
        # per task, the lanes that want it (request.task_shares); the first one's state is what the scheduler,
        # budgets and progress follow
        self.owners = [self._owners(task.name) for task in self.lanes[0].tasks]
        self.tasks = [self.lanes[owners[0]].tasks[i] for i, owners in enumerate(self.owners)]
        for index, task in enumerate(self.tasks):  # a task no share can search is not searched at all
            task.fallback = next((lane.tasks[index].fallback for lane in self.lanes if lane.tasks[index].fallback),
                                 None)
            task.exhausted = task.exhausted or task.fallback is not None
        self.warm_started: dict[str, int] = {}  # task -> foreign candidates measured again at this share
        # Several shares: task index -> the lane whose search's picks the task's batches take now, and
        # every search of the task in order as [lane, picks it gave, picks measured or answered].
        self.turn: dict[int, int] = {}
        self.searches: dict[int, list[list[int]]] = collections.defaultdict(list)
        # The cost model trains on its own thread, off the loop: one update at a time, in order; the search
        # predicts with the model trained so far.
        self.updater = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tunekit-model")
        self.scheduler = TaskScheduler(self.tasks, pool=request.pool, trials_per_iter=request.config.trials_per_iter,
                                       improving_only=request.improving_only,
                                       pool_key=str(request.tag.get("client")) if "client" in request.tag else None,
                                       min_task_share=request.config.min_task_share if request.measure_untuned
                                       else None, reweigh=self._fleet_objective())
        # A client started again on a dead one's shard: the pool trials the dead one drew and never
        # measured go back (the shard's records, counted into each task, say what it did measure).
        if request.count_existing:
            self.scheduler.settle_restart()

    # ---------------------------------------------------------------- set-up
    def _make_tasks(self, lane: ShareLane, *, first: bool) -> list[TaskState]:
        req, config = self.req, self.req.config
        t0 = time.perf_counter()
        # extracted_tasks_to_tune_contexts skips already-scheduled tasks: keep the lists aligned.
        keep = [i for i, t in enumerate(req.extracted_tasks) if not already_scheduled(t)]
        extracted = [req.extracted_tasks[i] for i in keep]
        budgets = [req.task_budgets[i] for i in keep] if req.task_budgets is not None else None
        kind = req.target.kind.name
        contexts, weights = search_contexts(extracted, req.target, req.work_dir, config=config,
                                            threads=self.search_threads)
        known = known_traces(lane.database)
        mine = {mod: len(found) for mod, found in known.items()} if req.count_existing and first else {}
        if req.known_database is not None and first:  # earlier runs' records: merged by structural equality
            for mod, found in known_traces(req.known_database).items():
                existing = _find(known, mod, None)
                if existing is None:
                    known[mod] = found
                else:
                    existing.update(found)
        tasks = []
        # a fleet's 76 tasks took 16 s one after another on an H200 host (benchmarks/RESULTS.md, "... its start shortened")
        spaces_of = draw_at_once(contexts, threads=self.search_threads,
                                 before=lambda i: task_faults.raise_if_injected("design_space", extracted[i].task_name))
        for i, (task, ctx, weight) in enumerate(zip(extracted, contexts, weights)):
            state = TaskState(i, task.task_name, float(weight), ctx, commit_workload_durably(lane.database, ctx.mod),
                              flops=task_flops(ctx.mod), family=task_family(task.task_name))
            try:
                spaces = spaces_of[i].result()
            except Exception as exc:  # no space: this task keeps its untuned kernel, the others are tuned
                state.fallback = f"design space: {error_line(str(exc))}"
                log.warning("task %s keeps its untuned kernel: %s", task.task_name, state.fallback)
            else:
                start_search(ctx, picks=config.trials_per_iter * config.search_batches_for(kind), design_spaces=spaces,
                             database=lane.database, cost_model=lane.cost_model)
                self._pre_tuned.append(ctx)
            state.budget = state.cap = config.trials if budgets is None else int(budgets[i])
            state.measured = state.resumed = _find(mine, ctx.mod, 0)
            _load_known(state, _find(known, ctx.mod, {}))
            tasks.append(state)
        self.phases.search_s += time.perf_counter() - t0
        return tasks

    def _fleet_objective(self):
        """The scheduler's reweigh for a fleet whose objective is its models' geometric mean; None otherwise."""
        if self.req.config.fleet_objective != "geomean" or not self.req.task_models:
            return None
        models: dict[str, dict[int, float]] = {}
        for index, task in enumerate(self.tasks):
            for model, units in self.req.task_models.get(task.name, {}).items():
                models.setdefault(model, {})[index] = units
        return lambda tasks: fleet_priorities(tasks, list(models.values()))

    def _owners(self, name: str) -> list[int]:
        wanted = (self.req.task_shares or {}).get(name)
        return [i for i, lane in enumerate(self.lanes) if wanted is None or lane.label in wanted] or \
            list(range(len(self.lanes)))

    def _next_searcher(self, task: TaskState) -> int:
        """The share whose search refills `task`'s picks: among the shares that want it, the one after the share
        whose picks were just spent (tasks start at different shares, so the first batches of a short run are not
        all the first share's). With one share, always that share."""
        owners, current = self.owners[task.index], self.turn.get(task.index)
        lane = owners[task.index % len(owners) if current not in owners else (owners.index(current) + 1) % len(owners)]
        self.turn[task.index] = lane
        return lane

    def _run(self, task: TaskState, runner_inputs: list) -> list:
        """The runner's futures of `runner_inputs`, measured at the shares that want `task`."""
        owners = self.owners[task.index]
        if len(owners) == len(self.lanes):
            return self.runner.run(runner_inputs)
        return self.runner.run(runner_inputs, labels=[self.lanes[i].label for i in owners])

    def _known(self, index: int, key: str) -> list | None:
        """run_secs of a candidate already measured (at any share: each is measured at every share that wants it)."""
        for lane in self.lanes:
            if key in lane.tasks[index].seen:
                return lane.tasks[index].seen[key]
        return None

    # ---------------------------------------------------------------- stages
    def _propose(self, task: TaskState, limit: int, *, reserve_only: bool = False) -> _Batch | None:
        """One batch of candidates for `task`: from what the task's last search picked beyond its
        earlier batches, else from a new search (main thread; MetaSchedule's C++ search releases the
        GIL, so the stage thread keeps building and measuring meanwhile). Up to `limit` (at most
        trials_per_iter) candidates not measured yet; known ones met on the way are answered from
        the record.

        With several shares, the share whose picks the batch takes keeps doing so until they are
        spent; only then does the next share search (a batch may end one share's picks and start the
        next's). Handing the task to the next share every batch instead left each share's picks in
        wait while the other shares' batches ran: on CUDA a search serves 4 batches, so with 3 shares
        the task's batches 3-11 were picked by searches made before batch 2, and only every 12th
        batch was steered by what the task had measured since, and each share's artifact came out
        slower than a search for that share alone (benchmarks/RESULTS.md, "share study").

        `reserve_only`: the task has a batch in flight: the batch takes only what is in reserve (None when
        that is empty; the task's space is not taken for used up)."""
        t = time.perf_counter()
        want = min(limit, self.req.config.trials_per_iter)
        try:
            candidates, keys, fresh, cached, proposers = [], [], [], [], []
            lane, searched = self.turn.get(task.index), False
            while len(fresh) < want:
                reserve = self.lanes[lane].tasks[task.index].reserve if lane is not None else []
                if not reserve:
                    # one search per batch (a search that gave only known picks ends it), none ahead of results
                    if searched or reserve_only:
                        break
                    lane, searched = self._next_searcher(task), True
                    if not self._search(task, lane):
                        break
                    continue
                candidate, key = reserve.pop(0)
                (fresh if self._known(task.index, key) is None else cached).append(len(candidates))
                candidates.append(candidate)
                keys.append(key)
                proposers.append(lane)
                self.lanes[lane].proposed += 1
                self.searches[task.index][-1][2] += 1
            if not candidates:  # the reserve was empty and the search found nothing
                if not reserve_only:
                    self.scheduler.exhaust(task)
                return None
            return _Batch(task, candidates, keys, fresh, cached, proposers=proposers)
        finally:
            self.phases.search_s += time.perf_counter() - t

    def _search(self, task: TaskState, lane: int) -> bool:
        """Run `lane`'s search for `task` once: its picks go to the task's reserve, best predicted first.
        False when the search has nothing more to give."""
        mine = self.lanes[lane].tasks[task.index]
        config, kind = self.req.config, self.req.target.kind.name
        try:
            task_faults.raise_if_injected("search", task.name)
            if mine.searches == 0 and not mine.seen:
                # Nothing measured for this task yet: sample and rank, no generations (clients.first_look).
                found = first_look.sample_ranked(mine.ctx, self.lanes[lane].cost_model, population=config.population,
                                                 keep=config.trials_per_iter * config.search_batches_for(kind))
                mine.first_looks += 1
            else:
                found = mine.ctx.generate_measure_candidates()
        except Exception as exc:  # this task keeps its untuned kernel (or its best so far), the others go on
            self.scheduler.fall_back(task, f"search: {error_line(str(exc))}")
            log.warning("task %s is not tuned further: %s", task.name, task.fallback)
            return False
        mine.searches += 1
        self.searches[task.index].append([lane, len(found or []), 0])
        if not found:
            return False
        texts = [trace_text(c.sch.trace) for c in found]
        keys = [hashlib.sha1(text.encode()).hexdigest() for text in texts]
        marked = {k for k, text in zip(keys, texts) if TENSORIZE_MARK in text}
        for each in self.lanes:
            each.tasks[task.index].tensorized.update(marked)
        queued = {key for _, key in mine.reserve}
        for candidate, key in zip(found, keys):
            if key not in queued:  # random samples can repeat one another
                queued.add(key)
                mine.reserve.append((candidate, key))
        return True

    def _build_and_submit(self, batch: _Batch):
        """Stage thread: build the batch's fresh candidates and hand each to the runner as soon as it is
        built (no batch barrier between building and measuring; with two stage threads the next
        batch's builds also start while this one's slowest candidate still builds)."""
        from tvm.s_tir.meta_schedule.builder import BuilderInput
        from tvm.s_tir.meta_schedule.runner import RunnerInput

        t = time.perf_counter()
        injected = task_faults.injected("build", batch.task.name)
        if injected is not None:
            from tvm.s_tir.meta_schedule.builder import BuilderResult

            return [BuilderResult(None, injected) for _ in batch.fresh], {}, time.perf_counter() - t
        pending = self.builder.submit([BuilderInput(batch.candidates[j].sch.mod, self.req.target)
                                       for j in batch.fresh]) if batch.fresh else []
        slot_of = {future: slot for slot, future in enumerate(pending)}
        built, runs = [None] * len(pending), {}
        for future in concurrent.futures.as_completed(pending):
            slot = slot_of[future]
            built[slot], _ = self.builder.collect(future)
            if built[slot].error_msg is None:
                j = batch.fresh[slot]
                runs[slot] = self._run(batch.task, [RunnerInput(built[slot].artifact_path, self.device_type,
                                                                batch.candidates[j].args_info)])[0]
        return built, runs, time.perf_counter() - t

    def _results_by_share(self, future) -> dict:
        """{share label: RunnerResult} of one candidate (a MultiShareRunner's future has one per share)."""
        if len(self.lanes) == 1:
            return {self.lanes[0].label: future.result()}
        return future.results()

    def _wait(self, batch: _Batch) -> tuple[list, list]:
        """Block until the batch is built and measured: (build results, {share: runner result} per slot)."""
        from tvm.s_tir.meta_schedule.runner import RunnerResult

        t = time.perf_counter()
        built, futures, build_s = batch.staged.result() if batch.staged is not None else ([], {}, 0.0)
        self.phases.build_s += build_s
        results = [self._results_by_share(futures[slot]) if slot in futures else
                   {lane.label: RunnerResult(None, b.error_msg or "build failed") for lane in self.lanes}
                   for slot, b in enumerate(built)]
        self.phases.wait_s += time.perf_counter() - t
        return built, results

    def _join(self, batch: _Batch) -> int:
        """A batch came back: record every trial at every share, train each share's cost model, tell
        the search that proposed it. Returns the number of trials it spent."""
        built, results = self._wait(batch)
        t = time.perf_counter()
        for build in built:
            timing = self.runner.timings.pop(str(build.artifact_path), None) if build.artifact_path else None
            if timing is not None:
                self.phases.load_s += timing.load_s
                self.phases.run_s += timing.run_s
                self.phases.lock_wait_s += timing.lock_wait_s
            callbacks.remove_artifact(build.artifact_path)
        unbuilt = [b.error_msg is not None for b in built]
        for index in self.owners[batch.task.index]:  # the shares that measured it
            lane = self.lanes[index]
            self._join_share(batch, lane, [r[lane.label] for r in results], unbuilt,
                             proposed=[j for j in batch.fresh + batch.cached if batch.proposer(j) == index])
        if self.runner.fatal is not None:
            raise self.runner.fatal  # every server of a share gone: stop, with what was measured recorded
        self._fall_back_if_failing(batch.task)
        self.phases.update_s += time.perf_counter() - t
        self._report_progress(batch.task, len(batch.fresh))
        return len(batch.fresh)

    def _fall_back_if_failing(self, task: TaskState) -> None:
        if task.exhausted or not task.keeps_failing(FAILING_BATCHES * self.req.config.trials_per_iter):
            return
        stage = "build" if task.failed_build == task.failed else "run"
        self.scheduler.fall_back(task, f"{stage}: its first {task.failed} candidates all failed: "
                                       f"{task.first_errors.get(stage, '')}")
        log.warning("task %s keeps its untuned kernel: %s", task.name, task.fallback)

    def _join_share(self, batch: _Batch, lane: ShareLane, results: list, unbuilt: list[bool], *,
                    proposed: list[int]) -> None:
        """One share's side of a batch: its records, its cost model, and its search, which hears about
        the candidates it picked (`proposed`: their indices). `unbuilt[i]`: the i-th fresh candidate
        failed to build."""
        from tvm.s_tir.meta_schedule.runner import RunnerResult

        from .session_runner import is_not_measured

        task = lane.tasks[batch.task.index]
        previous = task.effective_us
        ok_candidates, ok_results = [], []
        for j, result, no_build in zip(batch.fresh, results, unbuilt):
            if is_not_measured(result):
                continue  # never ran (the runner gave up on the share's servers): not a trial, not recorded
            secs = callbacks.run_secs_of(result)
            callbacks.add_to_database(lane.database, task=task, candidate=batch.candidates[j], secs=secs,
                                      target=self.req.target, key=(batch.keys[j], batch.keys[j] in task.tensorized))
            task.seen[batch.keys[j]] = secs
            us = mean_run_us(secs)
            task.record(us, key=batch.keys[j], tensorized=batch.keys[j] in task.tensorized, error=result.error_msg,
                        at_build=no_build)
            if us is not None:
                ok_candidates.append(batch.candidates[j])
                ok_results.append(result)
        self._update_model(lane.cost_model, task, ok_candidates, ok_results)
        if proposed:  # the search strategy hears about every candidate it proposed, the cached ones included
            result_of = dict(zip(batch.fresh, results))
            task.ctx.notify_runner_results(
                [batch.candidates[j] for j in proposed],
                [result_of[j] if j in result_of else RunnerResult(self._known(task.index, batch.keys[j]), None)
                 for j in proposed])
        task.after_batch(previous, fresh=len(batch.fresh), cached=len(batch.cached))

    def _update_model(self, cost_model, task: TaskState, candidates: list, results: list) -> None:
        if not candidates:
            return

        def update():
            t = time.perf_counter()
            callbacks.update_cost_model(cost_model, task=task, candidates=candidates, results=results)
            self.phases.model_s += time.perf_counter() - t

        self.updater.submit(update)

    def _report_progress(self, task: TaskState, trials: int) -> None:
        if self.req.pool is not None:
            self.req.pool.report(trials, key=self.scheduler.pool_key)
        if self.req.progress is not None:
            status = f"{task.name[:28]} best {task.best_us:.1f} us" if task.best_us else task.name[:28]
            self.req.progress.advance(trials, status=status)

    # ---------------------------------------------------------------- the loop
    def _limit(self, task: TaskState, spent: int, in_flight) -> int:
        """How many fresh candidates the next batch of `task` may measure (its batches in flight count
        against its cap: see _reserved)."""
        own = task.cap - task.measured - sum(len(b.fresh) for b in in_flight if b.task.index == task.index)
        if self.req.task_budgets is not None:
            return own  # per-task budgets: the task's own cap limits the batch
        remaining = self.req.config.trials - spent - sum(len(b.fresh) for b in in_flight)
        return min(remaining, own)

    def _reserved(self, in_flight) -> dict[int, int]:
        """{index: fresh trials in flight} of the tasks with a batch in flight that could send their next one
        now: their search left picks in reserve. Without it a client holding fewer tasks than the pipeline's
        depth could not fill it. The scheduler checks their caps."""
        pending = collections.Counter()
        for batch in in_flight:
            pending[batch.task.index] += len(batch.fresh)
        return {index: trials for index, trials in pending.items()
                if self.turn.get(index) is not None and self.lanes[self.turn[index]].tasks[index].reserve}

    def _out_of_time(self, started: float) -> bool:
        budget = self.req.config.time_budget_s
        return budget is not None and time.perf_counter() - started >= budget

    def _before_search(self, stage, started: float) -> int:
        """Per-task baselines, negligible tasks, warm start. Returns the trials it spent."""
        if self.req.measure_untuned:
            self._measure_untuned(started)
            if self.scheduler.min_task_share is not None:
                mark_negligible(self.tasks, self.scheduler.min_task_share)
        if self.req.records_dirs and set(self.req.records_dirs) == {lane.label for lane in self.lanes}:
            self._try_kernels(started)
        for task in self.tasks:
            if task.negligible or task.fallback:
                self.scheduler.release_unused(task)  # per-task budgets: its trials go to the pool
        warm = self._warm_batches()
        for batch in warm:
            batch.staged = stage.submit(self._build_and_submit, batch)
        return sum(self._join(batch) for batch in warm)

    def _warm_batches(self) -> list[_Batch]:
        """One batch per task of the best foreign records not measured here yet (clients.warm_start):
        they go through build, measurement and the database like any candidate."""
        if not self.req.warm_start:
            return []
        from . import warm_start

        chosen = warm_start.pick([t for t in self.tasks if not t.negligible and t.fallback is None],
                                 warm_start.best_records(self.req.warm_start),
                                 top_k=warm_start.TOP_K, trace_key=trace_key)
        if self.req.task_budgets is None:
            chosen = chosen[:self.req.config.trials]
        by_task: dict[int, list] = {}
        for task, record in chosen:
            try:
                by_task.setdefault(task.index, []).append((task, record.as_measure_candidate()))
            except Exception as exc:  # a trace that does not replay on this target: skip it
                log.info("warm start: a record of %s does not replay here: %s", task.name, exc)
        batches = []
        for pairs in by_task.values():
            task, candidates = pairs[0][0], [c for _, c in pairs]
            if self.req.task_budgets is not None:
                candidates = candidates[:max(0, task.cap - task.measured)]  # within the task's own budget
                if not candidates:
                    continue
            keyed = [key_and_mark(c.sch.trace) for c in candidates]
            keys = [key for key, _ in keyed]
            for each in self.lanes:
                each.tasks[task.index].tensorized.update(key for key, mark in keyed if mark)
            self.warm_started[task.name] = len(candidates)
            batches.append(_Batch(task, candidates, keys, list(range(len(candidates))), []))
        return batches

    def run(self) -> LoopOutcome:
        started = time.perf_counter()
        stage = concurrent.futures.ThreadPoolExecutor(max_workers=self.depth, thread_name_prefix="tunekit-build")
        in_flight: collections.deque[_Batch] = collections.deque()
        try:
            spent = self._before_search(stage, started)
            self._loop(stage, in_flight, started, spent)
        finally:
            stage.shutdown(wait=not in_flight, cancel_futures=True)
            self.updater.shutdown(wait=True)  # the saved model has every update
        for ctx in self._pre_tuned:
            ctx.post_tuning()
        for task in self.tasks:
            if not stop_requested():
                self.scheduler.release_unused(task)  # e.g. the search kept proposing known candidates
        wall = time.perf_counter() - started
        self.by_share = {lane.label: self._outcome(wall, lane) for lane in self.lanes}
        return self.by_share[self.lanes[0].label]

    def _note_in_flight(self, in_flight) -> None:
        """Called whenever a batch enters the pipeline or its join returns: adds up batch-seconds in flight."""
        now = time.perf_counter()
        if self._in_flight_since is not None:
            self._in_flight_s += self._in_flight_count * (now - self._in_flight_since)
        self._in_flight_since, self._in_flight_count = now, len(in_flight)

    def _loop(self, stage, in_flight, started: float, spent: int) -> None:
        loop_started = time.perf_counter()
        self._note_in_flight(in_flight)
        try:
            self._run_loop(stage, in_flight, started, spent)
        finally:
            self._note_in_flight(in_flight)
            self._loop_s = time.perf_counter() - loop_started

    def _run_loop(self, stage, in_flight, started: float, spent: int) -> None:
        idle_rounds, stopping = 0, False
        while True:
            # Ctrl-C or the time budget spent: launch nothing more, collect what is in flight.
            stopping = stopping or stop_requested() or self._out_of_time(started)
            has_room = self.req.task_budgets is not None or self.req.config.trials - spent > sum(
                len(b.fresh) for b in in_flight)
            task, busy = None, {b.task.index for b in in_flight}
            if has_room and not stopping and len(in_flight) < self.depth:
                task = self.scheduler.next_task(busy, ahead=sum(len(b.fresh) for b in in_flight),
                                                reserved=self._reserved(in_flight))
            if task is None:
                if not in_flight:
                    return
                spent += self._join(in_flight.popleft())
                self._note_in_flight(in_flight)  # the batch counted as in flight until its join returned
                continue
            ahead = task.index in busy  # its reserve only: its search has not heard the batch in flight
            batch = self._propose(task, self._limit(task, spent, in_flight), reserve_only=ahead)
            if batch is None:
                continue
            if not batch.fresh and batch.cached:
                # All candidates were known: no trial spent, but the search must hear back. When
                # every task keeps proposing known candidates the space is exhausted: stop
                # launching, still collect the batches in flight.
                self._join(batch)
                idle_rounds += 1
                stopping = stopping or idle_rounds > 4 * len(self.tasks)
                continue
            idle_rounds = 0
            self.sent_ahead += int(ahead)
            batch.staged = stage.submit(self._build_and_submit, batch)
            in_flight.append(batch)
            self._note_in_flight(in_flight)
            self.most_in_flight = max(self.most_in_flight, len(in_flight))

    def _outcome(self, wall: float, lane: ShareLane) -> LoopOutcome:
        per_task = self.req.task_budgets is not None
        shared = {"proposed_by": {each.label: each.proposed for each in self.lanes}} if len(self.lanes) > 1 else {}
        rows = [{"name": t.name, "workload_hash": workload_key(t.ctx.mod), "weight": int(t.weight),
                 "trials": t.measured, "failed": t.failed, "failed_build": t.failed_build,
                 **({"first_errors": t.first_errors} if t.first_errors else {}), "searches": t.searches,
                 **({"first_looks": t.first_looks} if t.first_looks else {}),
                 **({"resumed": t.resumed} if t.resumed else {}),
                 "cached": t.cached, "untuned_us": round(t.untuned_us, 3) if t.untuned_us else None,
                 "tuned_us": round(t.best_us, 3) if t.best_us else None, "fell_at": t.fell_at,
                 "measured_at": t.measured_at,
                 "flops": t.flops, "bytes": task_bytes(t.ctx.mod),
                 "speedup": round(t.untuned_us / t.best_us, 3) if t.untuned_us and t.best_us else None,
                 **({"kernel_us": round(t.kernel_us, 3), "kernel_config": t.kernel} if t.kernel_us else {}),
                 **({"untuned_error": t.untuned_error} if t.untuned_error else {}),
                 "negligible": t.negligible, **({"fallback": t.fallback} if t.fallback else {}),
                 **({"priority": round(t.priority, 4)} if t.priority != 1.0 else {}),  # config.fleet_objective
                 "tensorized_trials": t.tensorized_trials,
                 "best_tensorized": t.best_tensorized, "best_trace": t.best_key,
                 **({"warm_started": self.warm_started[t.name]} if t.name in self.warm_started else {}),
                 **({"share_searches": [[self.lanes[i].label, picks, used] for i, picks, used
                                        in self.searches[t.index]]} if len(self.lanes) > 1 else {}),
                 **({"budget": t.budget, "extra": t.extra, "exhausted": t.exhausted, **self.req.tag}
                    if per_task else {})}
                for t in lane.tasks]
        measured = sum(t.measured for t in lane.tasks)
        return LoopOutcome(measured, sum(t.failed for t in lane.tasks), sum(t.cached for t in lane.tasks), wall, rows,
                           {**self.phases.as_dict(wall, measured), **shared,
                            "pipeline": {"depth": self.depth, "most_in_flight": self.most_in_flight,
                                         "sent_ahead": self.sent_ahead,
                                         "mean_in_flight": round(self._in_flight_s / self._loop_s, 3)
                                         if self._loop_s else 0.0}},
                           self.runner.session_failures)

    def _measure_untuned(self, started: float) -> None:
        """One build + run per task of the unscheduled (or default-scheduled) kernel: the per-task baseline. The
        time budget covers them: once it is spent the rest keep no baseline (the runner drops them at shutdown)."""
        from tvm.s_tir.meta_schedule.arg_info import ArgInfo
        from tvm.s_tir.meta_schedule.builder import BuilderInput
        from tvm.s_tir.meta_schedule.runner import RunnerInput

        from .session_runner import is_not_measured

        inputs, owners = [], []
        for task in self.tasks:
            try:
                inputs.append(BuilderInput(untuned_module(task.ctx, self.req.target), self.req.target))
                owners.append(task)
            except Exception as exc:  # a task no default rule covers: no baseline for it
                log.info("no untuned baseline for %s: %s", task.name, exc)
        t = time.perf_counter()
        built = self.builder.build(inputs)
        self.phases.build_s += time.perf_counter() - t
        run_inputs, run_owners = [], []
        for task, result, inp in zip(owners, built, inputs):
            error = task_faults.injected("untuned", task.name) or result.error_msg
            if error is not None:
                callbacks.remove_artifact(result.artifact_path)
                self._no_baseline(task, f"build: {error_line(error)}")
            else:
                func = next(iter(inp.mod.functions.values()))
                try:
                    args_info = ArgInfo.from_prim_func(func)
                except Exception as exc:  # e.g. symbolic shapes left in the kernel: no baseline for it
                    log.info("no untuned baseline for %s: %s", task.name, error_line(str(exc)))
                    continue
                run_inputs.append(RunnerInput(result.artifact_path, self.device_type, args_info))
                run_owners.append((task, str(result.artifact_path)))
        t = time.perf_counter()
        futures = [self._run(task, [run_input])[0] for (task, _), run_input in zip(run_owners, run_inputs)]
        for (task, path), future in zip(run_owners, futures):
            if self._out_of_time(started):
                log.info("the time budget ran out while measuring the untuned kernels: %s and later tasks keep none",
                         task.name)
                break
            for label, result in self._results_by_share(future).items():
                self._lane(label).tasks[task.index].untuned_us = mean_run_us(result.run_secs)
                if result.error_msg and not is_not_measured(result):
                    self._no_baseline(task, f"run: {error_line(str(result.error_msg))}", label=label)
            self.runner.timings.pop(path, None)
            callbacks.remove_artifact(path)
        self.phases.wait_s += time.perf_counter() - t
        failed = [t for t in self.tasks if t.untuned_error]
        if failed:
            log.warning("%d task(s) have no untuned baseline (report tasks[].untuned_error); %s: %s", len(failed),
                        failed[0].name, failed[0].untuned_error)

    def _try_kernels(self, started: float) -> None:
        """Kernels of another kind for the GEMM tasks and the fused attentions (clients.kernel_trials), before the
        search: a task whose kernel is already fast gets fewer of the search's trials (the scheduler follows
        effective_us)."""
        from .kernel_trials import ScheduledTask, scheduled_tasks, try_kernels

        t = time.perf_counter()
        searched = len(self.tasks)
        try:
            fused = scheduled_tasks(self.req.fused_tasks, first_index=searched)
            best = try_kernels(
                self.tasks + fused, target=self.req.target, builder=self.builder, results_by_share=self._results_by_share,
                run=lambda task, inputs: self.runner.run(inputs) if task.index >= searched else self._run(task, inputs),
                records_dirs=self.req.records_dirs, on_progress=self._kernel_progress,
                reference_of=lambda task: task.ctx.mod["main"] if isinstance(task, ScheduledTask)
                else untuned_module(task.ctx, self.req.target)["main"],
                out_of_time=lambda: self._out_of_time(started))
        except Exception as exc:  # no kernel of another kind kills a run: the tasks keep MetaSchedule's
            log.warning("kernels of another kind were not tried: %s", error_line(str(exc)))
            best = {}
        for lane in self.lanes:
            for index, record in best.get(lane.label, {}).items():
                if index < searched:  # a fused attention's choice is made by the compile (kernels_worth_applying)
                    lane.tasks[index].kernel_measured(record.mean_us, f"{record.kind}:{record.config}")
        self.phases.kernels_s += time.perf_counter() - t

    def _kernel_progress(self, done: int, total: int) -> None:
        if self.req.progress is not None:
            self.req.progress.advance(0, status=f"Triton kernels {done}/{total}")

    def _lane(self, label: str) -> ShareLane:
        return next(lane for lane in self.lanes if lane.label == label)

    def _no_baseline(self, task: TaskState, error: str, *, label: str | None = None) -> None:
        """`task`'s untuned kernel failed (at `label`'s share, else at every share): why, for the report."""
        for lane in self.lanes:
            if label is None or lane.label == label:
                lane.tasks[task.index].untuned_error = lane.tasks[task.index].untuned_error or error
        log.info("no untuned baseline for %s: %s", task.name, error)


def run_search(request: SearchRequest, *, builder, runner, cost_model, search_threads: int,
               overlap: bool, share_cost_models: dict | None = None) -> dict:
    """Tune `request.extracted_tasks` with the engine's builder, runner and cost model(s):
    {share label: LoopOutcome}, `request.label` first (one entry unless `request.other_shares`)."""
    loop = SearchLoop(request, builder=builder, runner=runner, cost_model=cost_model, search_threads=search_threads,
                      overlap=overlap, share_cost_models=share_cost_models)
    loop.run()
    return loop.by_share
