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
"""
from __future__ import annotations

_SAMPLE = "s_tir.meta_schedule.SearchStrategyEvolutionarySearchSampleInitPopulation"


def sample_ranked(ctx, cost_model, *, population: int, keep: int) -> list:
    """Up to `keep` MeasureCandidates for `ctx`'s task, best predicted first: valid random schedules
    from `population` samples per round (the sampler retries rounds until it has the strategy's
    init_min_unmeasured valid ones, or gives up). `ctx` must be between pre_tuning and post_tuning."""
    import tvm_ffi
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo  # also registers the sampler below
    from tvm.s_tir.meta_schedule.search_strategy import MeasureCandidate

    schedules = list(tvm_ffi.get_global_func(_SAMPLE)(ctx.search_strategy, population))
    if not schedules:
        return []
    candidates = [MeasureCandidate(sch, ArgInfo.from_entry_func(sch.mod, remove_preproc=True)) for sch in schedules]
    scores = list(cost_model.predict(ctx, candidates))
    order = sorted(range(len(candidates)), key=lambda i: -float(scores[i]))
    return [candidates[i] for i in order[:keep]]
