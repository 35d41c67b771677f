"""Which task gets the next batch of trials, and what a task gives back when it cannot use its trials.

The counterpart of MetaSchedule's `TaskScheduler.next_task_id` / `join_running_task`, as plain
Python over `TaskState`s (no TVM objects needed), so that every decision can be unit-tested.

The rule (issue "trials where they matter"; measured before: after 448 ResNet-18 trials 9 of 19
tasks had never been tuned, one of them a 105 us conv, because a latency-weighted score kept
feeding the heaviest tasks):
1. Negligible tasks are not tuned: a task whose untuned weight x latency is under
   `min_task_share` of the model's total keeps its default schedule, until the rest of the model
   is tuned so far that it no longer is (then it is tuned like any other): on the 2-core CPU,
   ResNet-18's 1x1 convs are 0.3% of the untuned model, and were 4% of it after 256 trials had
   made the 3x3 convs 7x faster while they kept their default schedules.
2. Warm-up: every other task gets its first batch (heaviest first) before any task gets a second.
3. Then trials go by expected gain, as Ansor's task scheduler does (python/tvm/auto_scheduler/
   task_scheduler.py, v0.19): the task whose gradient
       weight x (alpha x backward + (1 - alpha) x forward)
   is the most negative, where backward is the task's latency change per batch over the last
   `window` batches, and forward the gain still expected: min(c - c/n, beta x FLOPs / the best
   FLOP rate among similar tasks) - c, with c its current latency and n its batches; the expected
   latency is never below the fastest kernel measured in the model (the launch floor).

Two budget modes:
- one global budget (`config.trials`, one process): every task may take any number of trials; the
  loop stops when the budget is spent;
- per-task budgets (the coordinator's clients): each task has its own cap; a task whose search
  space runs out gives its unused trials to the shared `pool`, and once every task has spent its
  cap the best one that still improves asks the pool for more.
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import error_line

# Ansor's defaults (auto_scheduler.GradientBasedTaskScheduler)
ALPHA, BETA, WINDOW = 0.2, 2.0, 3


@dataclass
class TaskState:
    """One tuning task as the search loop sees it (the TVM objects ride along in `ctx`/`workload`)."""

    index: int
    name: str
    weight: float
    ctx: object = None
    workload: object = None
    flops: float = 1.0
    family: str = ""
    measured: int = 0
    failed: int = 0
    cached: int = 0
    batches: int = 0          # batches that came back (cached-only ones included)
    best_us: float | None = None
    untuned_us: float | None = None
    untuned_error: str | None = None  # why its untuned kernel (the per-task baseline) has no time
    history: list = field(default_factory=list)  # effective_us after each batch
    fell_at: list = field(default_factory=list)  # [unix s, effective_us] each time a batch or a kernel lowered it
    measured_at: list = field(default_factory=list)  # [unix s, trials measured] each time a batch came back
    stale_batches: int = 0
    exhausted: bool = False
    negligible: bool = False  # under min_task_share of the model: not tuned
    cap: int = 0      # trials this task may measure (its budget, plus what it took from the pool)
    budget: int = 0   # its budget as planned
    extra: int = 0    # taken from the shared pool
    released: int = 0  # given back to the shared pool, in total (in this client's life)
    resumed: int = 0  # trials already in this client's database when the call began (count_existing)
    seen: dict = field(default_factory=dict)  # trace key -> run_secs already in the database
    tensorized: set = field(default_factory=set)  # trace keys of candidates that use a tensor intrinsic
    tensorized_trials: int = 0                    # measured candidates that did
    best_key: str | None = None                   # trace key of the best record
    # Candidates the task's last search picked beyond its batch, best predicted first (search_loop:
    # one search serves several batches); the task's next batches take them before it searches again.
    reserve: list = field(default_factory=list)
    searches: int = 0                             # searches run for the task (this share's view)
    first_looks: int = 0                          # of them, first searches that only sampled (clients.first_look)
    failed_build: int = 0   # of `failed`: candidates that never built (the others built but failed to run)
    first_errors: dict = field(default_factory=dict)  # "build" / "run" -> the first such error, one line
    # Why the task stopped being tuned and keeps its untuned kernel (its stage and first error line), if it did
    fallback: str | None = None
    kernel_us: float | None = None  # its fastest kernel of another kind, right at the share (clients.kernel_trials)
    kernel: str | None = None       # ... as "<kind>:<configuration>"
    priority: float = 1.0  # what a microsecond off it is worth beside `weight` (a fleet's objective, fleet_priorities)

    @property
    def best_tensorized(self) -> bool | None:
        return None if self.best_key is None else self.best_key in self.tensorized

    @property
    def effective_us(self) -> float | None:
        """What this task costs in the compiled model: the fastest of its best record, its untuned kernel and its best
        kernel of another kind (clients.compiler applies the fastest)."""
        known = [us for us in (self.best_us, self.untuned_us, self.kernel_us) if us is not None]
        return min(known) if known else None

    @property
    def searched_us(self) -> float | None:
        """What MetaSchedule's search has to beat to lower this task's latency: its best record or untuned kernel."""
        known = [us for us in (self.best_us, self.untuned_us) if us is not None]
        return min(known) if known else None

    @property
    def kernel_ahead(self) -> bool:
        """Its kernel of another kind is faster than anything the search has here (its best record or untuned
        kernel)."""
        return self.kernel_us is not None and self.searched_us is not None and self.kernel_us < self.searched_us

    def cost_in_model(self) -> float:
        """weight x latency: the share of the model's time this task stands for (inf when unknown,
        so an unmeasured task is never taken for a light one)."""
        latency = self.effective_us
        return self.weight * latency if latency is not None else float("inf")

    def record(self, us: float | None, *, key: str | None = None, tensorized: bool = False,
               error: str | None = None, at_build: bool = False) -> None:
        """One measured trial (us None: it failed, with `error`; `at_build`: it never built) of the
        candidate with trace key `key`."""
        self.measured += 1
        if tensorized:
            self.tensorized_trials += 1
            if key is not None:
                self.tensorized.add(key)
        if us is None:
            self.failed += 1
            self.failed_build += int(at_build)
            self.first_errors.setdefault("build" if at_build else "run", error_line(error))
        elif self.best_us is None or us < self.best_us:
            self.best_us, self.best_key = us, key

    def keeps_failing(self, limit: int) -> bool:
        """Every one of at least `limit` candidates failed: more of them would waste the run's trials."""
        return self.best_us is None and self.failed >= limit and self.failed == self.measured - self.resumed

    def after_batch(self, previous_us: float | None, *, fresh: int, cached: int) -> None:
        """A batch came back: a task that improved by less than 1% counts one more stale batch; one
        whose search proposed only known candidates has converged and counts another."""
        now = self.effective_us
        improved = now is not None and (previous_us is None or now < previous_us * 0.99)
        self.stale_batches = 0 if improved else self.stale_batches + 1
        if not fresh and cached:
            self.stale_batches += 1
        self.cached += cached
        self.batches += 1
        self.history.append(now)
        self.measured_at.append([round(time.time(), 2), self.measured])
        self._note_fall(previous_us)

    def kernel_measured(self, us: float, kernel: str) -> None:
        """Its fastest kernel of another kind (`kernel`, "<kind>:<configuration>") measured `us` at the share: a fall
        like a batch's where it beats what the task had (the model runs it from now on)."""
        previous = self.effective_us
        self.kernel_us, self.kernel = us, kernel
        self._note_fall(previous)

    def _note_fall(self, previous_us: float | None) -> None:
        now = self.effective_us
        if now is not None and (previous_us is None or now < previous_us):
            self.fell_at.append([round(time.time(), 2), round(now, 3)])


def mark_negligible(tasks: list[TaskState], min_share: float) -> None:
    """Tasks under `min_share` of the model's untuned weight x latency are not tuned. Only tasks with
    an untuned measurement can be judged; without any, nothing is skipped."""
    known = [t for t in tasks if t.untuned_us is not None]
    total = sum(t.weight * t.untuned_us for t in known)
    for task in known:
        task.negligible = total > 0 and task.weight * task.untuned_us < min_share * total


def reconsider_negligible(tasks: list[TaskState], min_share: float) -> list[TaskState]:
    """Negligible tasks that are `min_share` of the model as it is now (each task at its best so
    far) are tuned after all; returns them. A task is never made negligible here: that is decided
    once, on the untuned model (mark_negligible)."""
    known = [t for t in tasks if t.effective_us is not None]
    total = sum(t.weight * t.effective_us for t in known)
    woken = [t for t in known if t.negligible and t.weight * t.effective_us >= min_share * total]
    for task in woken:
        task.negligible = False
    return woken


def gradient(task: TaskState, tasks: list[TaskState], *, alpha: float = ALPHA, beta: float = BETA,
             window: int = WINDOW) -> float:
    """Ansor's gradient of the model's latency w.r.t. one more batch of `task` (more negative: more
    to gain). Latencies in us, as the task's history has them."""
    cost = task.effective_us
    if cost is None:
        return float("-inf")  # nothing measured at all: find out first
    if task.batches == 0 and task.kernel_ahead:
        # Never searched, and a kernel of another kind beats where the search starts: no gain is known. ViT-B/16's
        # GEMMs spent 32 of 48 trials reaching 3-4x their Triton kernels (benchmarks/RESULTS.md, "Five transformers")
        return 0.0
    history = [h for h in task.history if h is not None]
    if len(history) > window:
        backward = (history[-1] - history[-1 - window]) / window
    elif len(history) >= 2:
        backward = (history[-1] - history[0]) / (len(history) - 1)
    else:
        backward = 0.0
    rounds = max(1, task.batches)
    # What the search's next batch may reach, from its own kernels: a task whose kernel of another kind (a Triton
    # GEMM) is faster than MetaSchedule's best gains nothing until the search gets below it. Its GEMMs had taken
    # 880 of ViT-B/16's 1,130 trials, 2.5x slower than their Triton kernels (benchmarks/RESULTS.md, "Triton").
    searched = task.searched_us or cost
    expected = searched - searched / rounds
    similar = [t for t in tasks if t.family == task.family and t.searched_us and t.flops > 1.0]
    if task.flops > 1.0 and len(similar) > 1:
        best_rate = max(t.flops / t.searched_us for t in similar)
        expected = min(expected, beta * task.flops / best_rate)
    # No kernel gets faster than the fastest kernel measured in the model (launch and sync): without
    # this floor a launch-bound kernel's whole latency looked winnable and took most of the trials.
    floor = min((t.effective_us for t in tasks if t.effective_us), default=0.0)
    forward = min(0.0, max(expected, min(floor, cost)) - cost)
    return task.weight * task.priority * (alpha * backward + (1 - alpha) * forward)


def fleet_priorities(tasks: list[TaskState], models: list[dict[int, float]]) -> None:
    """A fleet's objective as the weighted geometric mean of its models' latencies (Ansor's f3, sum of w log L):
    `models` holds, per model, {task index: model weight x the task's count in it}. A microsecond off task t is worth
    sum_m(u_mt / L_m) / sum_m(u_mt) times the gradient rule's (which lowers sum_m L_m), scaled by the geometric
    mean of the L_m; a model with a task not measured yet counts as that mean."""
    latencies = []
    for units in models:
        known = [(u, tasks[i].effective_us) for i, u in units.items()]
        latencies.append(None if any(us is None for _, us in known) else sum(u * us for u, us in known))
    measured = [lat for lat in latencies if lat]
    if not measured:
        return
    mean = math.exp(sum(math.log(lat) for lat in measured) / len(measured))
    worth: dict[int, list[float]] = {}
    for units, lat in zip(models, latencies):
        for i, u in units.items():
            pair = worth.setdefault(i, [0.0, 0.0])
            pair[0] += u * mean / (lat or mean)
            pair[1] += u
    for i, (relative, plain) in worth.items():
        tasks[i].priority = relative / plain if plain else 1.0


class TaskScheduler:
    def __init__(self, tasks: list[TaskState], *, pool=None, trials_per_iter: int, improving_only: bool = True,
                 pool_key: str | None = None, min_task_share: float | None = None,
                 reweigh: Callable[[list[TaskState]], None] | None = None):
        """`pool_key`: who this scheduler is to the pool (a client's shard): each task's releases are
        declared under `<pool_key>/<task>`, so a restarted client's repeated releases count once.
        `min_task_share`: the share under which tasks were marked negligible (mark_negligible); a
        negligible task is reconsidered against the model as tuned so far before every choice.
        `reweigh`: sets the tasks' `priority` before every choice (a fleet's objective, fleet_priorities)."""
        self.tasks = tasks
        self.pool = pool
        self.trials_per_iter = trials_per_iter
        self.improving_only = improving_only
        self.pool_key = pool_key
        self.min_task_share = min_task_share
        self.reweigh = reweigh

    def _best(self, tasks: list[TaskState]) -> TaskState:
        return min(tasks, key=lambda t: (gradient(t, self.tasks), -t.cost_in_model()))

    def _open(self, busy: set[int]) -> list[TaskState]:
        return [t for t in self.tasks if not t.exhausted and not t.negligible and t.index not in busy]

    def next_task(self, busy: set[int], ahead: int = 0, *, reserved: dict[int, int] | None = None) -> TaskState | None:
        """The task to search next; `busy` are the indices of tasks with a batch in flight (a task is
        never searched again before its last batch came back: the search must hear the results).
        `ahead`: the trials of those batches not yet measured, which the pool weighs in its last trials
        (None back while it defers: measure what is in flight, then ask again).
        `reserved`: {index: trials in flight} of busy tasks that could send another batch without a search
        (their last search left picks in reserve). One of them is chosen only when no idle task may take
        a batch and its cap has room beyond its trials in flight (never a draw from the pool: such draws come
        at the rate a client sends, not at the rate it measures, and emptied the pool early)."""
        reserved = reserved or {}
        if self.reweigh is not None:
            self.reweigh(self.tasks)
        if self.min_task_share is not None:
            reconsider_negligible(self.tasks, self.min_task_share)
        open_tasks = [t for t in self._open(busy) if t.measured < t.cap]
        if open_tasks:
            warm_up = [t for t in open_tasks if t.batches == 0 and not t.kernel_ahead]  # see gradient
            if warm_up:
                return max(warm_up, key=lambda t: (t.cost_in_model(), t.flops * t.weight))
            return self._best(open_tasks)
        # Rather than leave a slot of the pipeline empty (a client holding fewer tasks than its depth),
        # a busy task sends the picks its search already made; it spends its own cap, not the pool's.
        in_reserve = [t for t in self.tasks if t.index in reserved and not t.exhausted and not t.negligible]
        ready = [t for t in in_reserve if t.measured + reserved[t.index] < t.cap]
        if ready:
            return self._best(ready)
        if self.pool is None:
            return None
        # Every task spent its budget: the best one that still improves asks the pool for more.
        hopeful = [t for t in self._open(busy) if t.stale_batches == 0 or not self.improving_only]
        if not hopeful:
            return None
        # by key: a restart gives back the unmeasured, and the pool knows whose pipeline is whose
        granted = self.pool.take(self.trials_per_iter, key=self.pool_key, ahead=ahead)
        if not granted:
            return None
        # A part, not a whole batch: the pool's last trials. A task whose last search left candidates in
        # reserve measures them at once; one that must search first holds its client for a whole search
        # for those few trials, and the run ends with that client. A reserve
        # that holds the whole part first: a batch that empties its reserve searches for the rest.
        ready = []
        if granted < self.trials_per_iter:
            ready = [t for t in hopeful if len(t.reserve) >= granted] or [t for t in hopeful if t.reserve]
        best = self._best(ready or hopeful)
        best.cap += granted
        best.extra += granted
        return best

    def settle_restart(self) -> int:
        """This client took over the shard of one that died: what it drew from the pool and did not
        measure goes back. What it did measure beyond the tasks' budgets is in the shard's records, which
        set each task's `measured` (so call this before any draw). Returns the trials given back."""
        if self.pool is None or self.pool_key is None:
            return 0
        return self.pool.settle(self.pool_key, sum(max(0, t.measured - t.budget) for t in self.tasks))

    def release_unused(self, task: TaskState) -> None:
        """A task that will not measure more gives what is left of its cap back to the pool."""
        if self.pool is not None and task.cap > task.measured:
            task.released += task.cap - task.measured
            if self.pool_key is None:
                self.pool.release(task.cap - task.measured)
            else:
                self.pool.release(task.released, key=f"{self.pool_key}/{task.name}")
            task.cap = task.measured

    def exhaust(self, task: TaskState) -> None:
        """The search found no candidate: the task's space is used up."""
        task.exhausted = True
        self.release_unused(task)

    def fall_back(self, task: TaskState, reason: str) -> None:
        """The task keeps failing (`reason`: its stage and first error line): it is not tuned any more, and keeps
        its untuned kernel in the compiled model."""
        task.fallback = task.fallback or error_line(reason)
        self.exhaust(task)
