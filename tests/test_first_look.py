"""A task's first look (clients.first_look): sampled schedules ranked by the cost model, on a real
TuneContext of the example model's conv for an H100 (the search lowers and verifies; no GPU runs)."""
import hashlib

import numpy as np
import pytest
from tvm.s_tir import meta_schedule as ms
from tvm.ir.utils import derived_object

from tunekit.clients.first_look import sample_ranked
from tunekit.metaschedule_env import import_for_target, prepare_metaschedule_logging
from tunekit.records.trace_keys import trace_key


@derived_object
class TraceHashModel(ms.cost_model.PyCostModel):
    """A cost model whose score is a fixed function of the schedule (its trace's hash), so a ranking
    by it can be checked; it learns nothing."""

    def load(self, path):
        pass

    def save(self, path):
        pass

    def update(self, context, candidates, results):
        pass

    def predict(self, context, candidates):
        return np.array([_score(c) for c in candidates], dtype="float64")


def _score(candidate) -> float:
    return int(hashlib.sha1(trace_key(candidate.sch.trace).encode()).hexdigest()[:8], 16) / 2 ** 32


@pytest.mark.e2e
def test_the_first_look_ranks_valid_samples_by_the_cost_model_and_leaves_the_search_usable(example_model,
                                                                                          tmp_path):
    from tvm.target import Target

    from tunekit.frontend.tasks import extract_tasks, prepare_for_tuning
    from tunekit.run.session import load_model

    target = Target("nvidia/nvidia-h100")
    prepared = prepare_for_tuning(load_model(example_model).mod, target)
    task = next(t for t in extract_tasks(prepared, target) if "conv2d" in t.task_name)
    prepare_metaschedule_logging()
    # as the engine does (make_engine): without it the test depends on which target an earlier test
    # of this process imported the intrinsics for (an in-process CPU tune registers only the CPU's)
    import_for_target("cuda")
    strategy = ms.search_strategy.EvolutionarySearch(population_size=32, genetic_num_iters=1, init_min_unmeasured=8)
    (ctx,), _ = ms.relax_integration.extracted_tasks_to_tune_contexts([task], str(tmp_path), strategy=strategy,
                                                                      num_threads=2, seed=0)
    model = TraceHashModel()
    ctx.pre_tuning(max_trials=64, num_trials_per_iter=8, design_spaces=ctx.generate_design_space(),
                   database=ms.database.MemoryDatabase(), cost_model=model)
    ranked = sample_ranked(ctx, model, population=32, keep=12)
    assert 8 <= len(ranked) <= 12  # the sampler keeps going until init_min_unmeasured are valid
    scores = [_score(c) for c in ranked]
    assert scores == sorted(scores, reverse=True)
    # real candidates (their arguments known), no schedule twice
    assert all(c.args_info for c in ranked) and len({trace_key(c.sch.trace) for c in ranked}) == len(ranked)
    # the task's own search state is intact: the evolutionary search runs after the first look
    assert ctx.generate_measure_candidates()
    ctx.post_tuning()


def test_a_search_goes_on_after_being_told_of_more_candidates_than_the_trial_budget(example_model, tmp_path):
    """The loop tells a task's search of every candidate it proposed, the known ones too, and keeps the budget itself
    (search_loop.start_search). With the budget as MetaSchedule's own limit, a search that had met one known
    candidate gave nothing more and the run ended a trial short (test_engine's 11 of 12)."""
    from tvm.s_tir.meta_schedule.runner import RunnerResult
    from tvm.target import Target

    from tunekit.clients.search_loop import start_search
    from tunekit.frontend.tasks import extract_tasks, prepare_for_tuning
    from tunekit.run.session import load_model

    import_for_target("llvm")
    prepare_metaschedule_logging()
    target = Target({"kind": "llvm", "num-cores": 1})
    task = next(t for t in extract_tasks(prepare_for_tuning(load_model(example_model).mod, target), target)
                if "conv2d" in t.task_name)
    strategy = ms.search_strategy.EvolutionarySearch(population_size=16, genetic_num_iters=1, init_min_unmeasured=4)
    (ctx,), _ = ms.relax_integration.extracted_tasks_to_tune_contexts([task], str(tmp_path), strategy=strategy,
                                                                      num_threads=1, seed=0)
    trials = 4  # the run's --trials
    start_search(ctx, picks=trials, design_spaces=ctx.generate_design_space(), database=ms.database.MemoryDatabase(),
                 cost_model=ms.cost_model.RandomModel())
    first = ctx.generate_measure_candidates()
    assert first
    # every pick, known or not, is heard of: as many as the budget
    ctx.notify_runner_results(first[:1] * trials, [RunnerResult([1e-3], None)] * trials)
    assert ctx.generate_measure_candidates()
    ctx.post_tuning()
