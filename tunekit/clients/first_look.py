"""A task's first candidates: random valid schedules ranked by the cost model, without evolution.

MetaSchedule's evolutionary search samples a population and then mutates it for a few generations,
guided by the cost model. Before a task has a single measurement, that guidance is weak: the model
has seen only other tasks (or nothing, and then XGBModel answers with random scores). Yet the
generations are most of a search's cost (benchmarks/RESULTS.md, "First look"), and every meaningful
task pays one first search before the run can say anything about it.

So a task's first search only samples (the same sampler as the evolutionary search's initial
population, on the task's own search state and threads) and ranks the valid schedules with the
cost model. From the task's second search on, the evolutionary search runs as usual, seeded by
the first look's measured records from the database.

While the cost model has not trained, it ranks at random, so a first look then samples only until it
has as many valid schedules as it keeps. Where the search overlaps building and measuring (GPU shares), `Ahead` draws
the tasks' first looks on threads of their own, several at once, in the order the loop will ask for
them: one search thread was the bottleneck of a GPU run (benchmarks/RESULTS.md, "first looks ahead").
"""
from __future__ import annotations

import concurrent.futures

_SAMPLE = "s_tir.meta_schedule.SearchStrategyEvolutionarySearchSampleInitPopulation"


def sample_ranked(ctx, cost_model, *, population: int, keep: int, draw=None) -> list:
    """Up to `keep` MeasureCandidates for `ctx`'s task, best predicted first: valid random schedules
    from `population` samples per round (the sampler retries rounds until it has the strategy's
    init_min_unmeasured valid ones, or gives up). `ctx` must be between pre_tuning and post_tuning.
    An untrained cost model ranks at random: then rounds of `keep` samples, only until `keep` are valid
    or `population` were drawn. `draw(strategy, n)`: the sampler (TVM's; a test counts its rounds)."""
    import tvm_ffi
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo  # also registers the sampler below
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    draw = draw or tvm_ffi.get_global_func(_SAMPLE)
    if trained(cost_model):
        schedules = list(draw(ctx.search_strategy, population))
    else:  # the samples beyond `keep` valid ones would never be ranked above them
        schedules, drawn = [], 0
        while len(schedules) < keep and drawn < population:
            found = list(draw(ctx.search_strategy, keep))
            schedules += found
            drawn += keep
            if not found:  # the sampler gave up
                break
    if not schedules:
        return []
    candidates = [MeasureCandidate(sch, ArgInfo.from_entry_func(sch.mod, remove_preproc=True)) for sch in schedules]
    scores = list(cost_model.predict(ctx, candidates))
    order = sorted(range(len(candidates)), key=lambda i: -float(scores[i]))
    return [candidates[i] for i in order[:keep]]


def trained(cost_model) -> bool:
    """Whether the cost model's predictions are its own (XGBModel answers with random scores until it has
    trained on num_warmup_samples measurements)."""
    if not hasattr(cost_model, "num_warmup_samples"):
        return True  # not an XGBModel: take its predictions for what they are
    return getattr(cost_model, "booster", None) is not None and cost_model.data_size >= cost_model.num_warmup_samples


class Ahead:
    """First looks drawn on `workers` threads before the loop asks for them. Each is started for a key (the
    loop's (share lane, task index)) with a TuneContext no other thread touches until `take` returns it;
    `close` cancels those not started and waits for the rest (before the contexts' post_tuning)."""

    def __init__(self, *, workers: int):
        self.workers = workers
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="tunekit-first-look")
        self._futures: dict = {}
        self.started = self.taken = 0

    def start(self, key, ctx, cost_model, *, population: int, keep: int) -> None:
        self._futures[key] = self._pool.submit(sample_ranked, ctx, cost_model, population=population, keep=keep)
        self.started += 1

    def has(self, key) -> bool:
        return key in self._futures

    def take(self, key) -> list:
        """The key's first look (raises what it raised); the caller waits for it if it is still drawn."""
        future = self._futures.pop(key)
        self.taken += 1
        return future.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._futures.clear()

    def describe(self) -> dict:
        return {"workers": self.workers, "started": self.started, "taken": self.taken}
