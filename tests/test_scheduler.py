"""The allocation rule (clients.scheduler), on hand-made tasks: no TVM, no processes."""
import pytest

from tunekit.clients.scheduler import TaskScheduler, TaskState, fleet_priorities, gradient, mark_negligible
from tunekit.errors import error_line


def _tasks(untuned_us: list[float], *, flops=None, family="conv2d", cap=1 << 30) -> list[TaskState]:
    tasks = []
    for i, us in enumerate(untuned_us):
        task = TaskState(i, f"t{i}", 1.0, flops=(flops or [1e9] * len(untuned_us))[i], family=family)
        task.untuned_us, task.cap = us, cap
        tasks.append(task)
    return tasks


def _simulate(scheduler: TaskScheduler, batches: int, improve) -> list[int]:
    """Run `batches` rounds: pick, then report a batch whose best is improve(task) (or unchanged)."""
    order = []
    for _ in range(batches):
        task = scheduler.next_task(set())
        if task is None:
            break
        order.append(task.index)
        previous, best = task.effective_us, improve(task)
        for _ in range(8):
            task.record(best)
        task.after_batch(previous, fresh=8, cached=0)
    return order


def test_every_meaningful_task_gets_a_batch_before_any_gets_a_third():
    # One task dominates (the old rule kept feeding it); the others are each >= 0.5% of the model.
    tasks = _tasks([1000.0, 60.0, 40.0, 30.0, 20.0, 10.0])
    mark_negligible(tasks, 0.005)
    order = _simulate(TaskScheduler(tasks, trials_per_iter=8), 12, lambda t: t.effective_us * 0.9)
    first_third = next(i for i, task in enumerate(order) if order[:i + 1].count(task) == 3)
    assert set(order[:first_third]) == {0, 1, 2, 3, 4, 5}
    assert order[:6] == [0, 1, 2, 3, 4, 5]  # the warm-up goes heaviest first


def test_negligible_tasks_are_never_tuned():
    tasks = _tasks([1000.0, 200.0, 1.0, 0.5])  # the last two are 0.1% and 0.04% of the model
    mark_negligible(tasks, 0.005)
    assert [t.negligible for t in tasks] == [False, False, True, True]
    order = _simulate(TaskScheduler(tasks, trials_per_iter=8), 20, lambda t: t.effective_us * 0.95)
    assert set(order) == {0, 1}
    # without untuned measurements nothing can be judged negligible
    unknown = _tasks([None, None])
    mark_negligible(unknown, 0.005)
    assert not any(t.negligible for t in unknown)


def _history(task: TaskState, bests: list[float]) -> None:
    for best in bests:
        previous = task.effective_us
        task.record(best)
        task.after_batch(previous, fresh=8, cached=0)


def test_after_the_warm_up_trials_go_where_the_expected_gain_is_largest():
    # Same latency now, same number of batches: the task still improving (backward term) goes first.
    tasks = _tasks([500.0, 500.0], flops=[1.0, 1.0])  # no FLOP estimate: forward term c - c/n only
    scheduler = TaskScheduler(tasks, trials_per_iter=8)
    _history(tasks[0], [400.0, 300.0, 200.0, 100.0])
    _history(tasks[1], [100.0, 100.0, 100.0, 100.0])
    assert gradient(tasks[0], tasks) < gradient(tasks[1], tasks)
    assert scheduler.next_task(set()) is tasks[0]
    # With one batch each, the forward term (c - c/n: as if a task could still reach 0) favours the
    # task that costs the model more, as Ansor's does.
    fresh = _tasks([500.0, 500.0], flops=[1.0, 1.0])
    _history(fresh[0], [250.0])
    _history(fresh[1], [499.0])
    assert TaskScheduler(fresh, trials_per_iter=8).next_task(set()) is fresh[1]
    # a busy task is skipped however promising it is
    assert scheduler.next_task({0}) is tasks[1]


def test_the_forward_term_uses_the_flop_rate_of_similar_tasks():
    # Same latency and history, but task 1 runs at a tenth of the FLOP rate task 0 reached: it has
    # more left to gain (Ansor's beta x FLOPs / best rate of its group).
    tasks = _tasks([100.0, 100.0], flops=[1e9, 1e9])
    _history(tasks[0], [10.0] * 4)
    _history(tasks[1], [50.0] * 4)
    # alone, task 1 would be expected to gain c/n; beside a similar task 5x faster, down to 2 x 10 us
    assert gradient(tasks[1], tasks) < gradient(tasks[1], [tasks[1]])


def test_launch_bound_tasks_do_not_take_the_trials_of_heavy_ones():
    """BERT-base at 40% (H100): two 3.7 us attention matmuls of 25 MFLOP took 1,550 of 2,030 trials
    while the 14-18 us projections of 600 MFLOP got 64-112 each: beside the projections' FLOP rate a
    25 MFLOP kernel "should" take 0.1 us, so its whole latency looked winnable. No kernel runs
    faster than the fastest one measured in the model (3.2 us there), so the projections go first."""
    tasks = _tasks([7.5, 7.5, 68.0, 54.0, 3.2], flops=[25e6, 25e6, 604e6, 906e6, 1.0], family="matmul")
    for task in tasks:
        task.weight = 12.0
    for task, bests in zip(tasks, ([3.8] * 6, [3.7] * 6, [14.0] * 5, [13.8] * 6, [3.2])):
        _history(task, bests)
    scheduler = TaskScheduler(tasks, trials_per_iter=16)
    assert scheduler.next_task(set()) in (tasks[2], tasks[3])
    for small in tasks[:2]:
        assert gradient(small, tasks) > gradient(tasks[2], tasks)


def test_per_task_caps_and_the_pool():
    from tunekit.coordinator.budget import TrialPool

    tasks = _tasks([100.0, 50.0, 0.01], cap=8)
    pool = TrialPool(0)
    scheduler = TaskScheduler(tasks, pool=pool, trials_per_iter=8)
    mark_negligible(tasks, 0.005)
    scheduler.release_unused(tasks[2])  # a negligible task's budget goes to the pool
    assert pool.status()["available"] == 8 and tasks[2].cap == 0
    _simulate(scheduler, 2, lambda t: t.effective_us * 0.5)  # both spend their caps, improving
    assert [t.measured for t in tasks] == [8, 8, 0]
    extra = scheduler.next_task(set())
    assert extra is not None and extra.extra == 8 and pool.status()["available"] == 0
    assert scheduler.next_task({extra.index}) is None  # the pool is empty


def test_a_client_tells_the_pool_what_it_has_ahead_and_waits_when_deferred():
    """In the pool's last trials a client with a long pipeline gets nothing: next_task says None (the loop then
    measures what is in flight) and the task's cap is unchanged; with the pipeline measured it draws its part."""
    from tunekit.coordinator.budget import TrialPool

    pool = TrialPool(12, takers=2)
    tasks = _tasks([100.0, 50.0], cap=8)
    scheduler = TaskScheduler(tasks, pool=pool, trials_per_iter=8, pool_key="0")
    _simulate(scheduler, 2, lambda t: t.effective_us * 0.5)  # both spend their own budgets
    assert scheduler.next_task({0}, ahead=12) is None  # 12 ahead >= ceil((12 + 12) / 2)
    assert pool.status() == {**pool.status(), "available": 12, "deferred": 1} and tasks[1].cap == 8
    extra = scheduler.next_task(set(), ahead=0)
    assert extra is not None and extra.extra == 6 and pool.available == 6  # ceil(12 / 2)


def test_the_pools_last_trials_go_to_a_task_with_candidates_in_reserve():
    """A part of the pool's last trials goes to a task that needs no search (candidates left in reserve by
    its last one) before the task the gradient prefers; a whole batch still follows the gradient."""
    from tunekit.coordinator.budget import TrialPool

    def spent(reserve: bool, pool: TrialPool) -> tuple[TaskScheduler, list]:
        tasks = _tasks([100.0, 50.0], cap=8)
        _simulate(TaskScheduler(tasks, trials_per_iter=8), 2, lambda t: t.effective_us * 0.5)  # budgets spent
        tasks[1].reserve = [("candidate", "key")] if reserve else []
        return TaskScheduler(tasks, pool=pool, trials_per_iter=8, pool_key="0"), tasks

    scheduler, tasks = spent(True, TrialPool(100, takers=2))
    assert scheduler.next_task(set()) is tasks[0]  # a whole batch: the heavier task, as the gradient has it
    scheduler, tasks = spent(True, TrialPool(10, takers=2))
    assert scheduler.next_task(set()) is tasks[1] and tasks[1].extra == 5  # ceil(10 / 2), to the task in reserve
    scheduler, tasks = spent(False, TrialPool(10, takers=2))
    assert scheduler.next_task(set()) is tasks[0]  # nothing in reserve anywhere: the gradient again
    scheduler, tasks = spent(True, TrialPool(10, takers=2))
    tasks[0].reserve = [("c", "k")]  # the task the gradient prefers holds 1 of the part of 5, tasks[1] all 5
    tasks[1].reserve = [("c", str(k)) for k in range(5)]
    assert scheduler.next_task(set()) is tasks[1]


def test_a_busy_task_sends_its_reserve_only_when_no_idle_task_can_take_the_slot():
    """`reserved` ({busy task: its trials in flight}, for busy tasks whose search left picks in reserve): one of
    them is chosen only when every idle task is spent or done; first one with cap room beyond its trials in
    flight, without the pool. A busy task never draws from the pool: its batch comes back first."""
    from tunekit.coordinator.budget import TrialPool

    tasks = _tasks([100.0, 50.0, 30.0], cap=16)
    pool = TrialPool(16)
    scheduler = TaskScheduler(tasks, pool=pool, trials_per_iter=8)
    _simulate(scheduler, 3, lambda t: t.effective_us * 0.5)  # the warm-up: each task one batch of its 16
    assert scheduler.next_task({0, 1}, reserved={0: 0, 1: 0}) is tasks[2]  # an idle task that may take a batch
    tasks[2].measured = tasks[2].cap  # spent
    chosen = scheduler.next_task({0, 1}, reserved={0: 0, 1: 0})
    assert chosen in (tasks[0], tasks[1]) and pool.status()["available"] == 16 and chosen.extra == 0
    assert scheduler.next_task({0, 1}, reserved={1: 0}) is tasks[1]  # only what the loop found in reserve
    # tasks[1]'s cap is taken by its batch in flight: the idle tasks[2] still improves, so the pool serves it
    assert scheduler.next_task({0, 1}, reserved={1: 8}) is tasks[2] and tasks[2].extra == 8
    tasks[2].measured, tasks[2].stale_batches = tasks[2].cap, 2  # measured them, no longer improving
    # the busy task waits for its batch; the pool keeps its trials for other clients
    assert scheduler.next_task({0, 1}, reserved={1: 8}) is None and pool.status()["available"] == 8


def test_a_restarted_client_does_not_release_its_budget_twice():
    """A client restarted on its shard recomputes the same unused budgets (a negligible task's, an
    exhausted task's): the pool adds them once (seen: 12 trials measured against --trials 10)."""
    from tunekit.coordinator.budget import TrialPool

    pool = TrialPool(0)
    for _life in range(2):  # the client, then the client restarted on the same shard
        tasks = _tasks([100.0, 0.01], cap=4)
        scheduler = TaskScheduler(tasks, pool=pool, trials_per_iter=8, pool_key="client-1")
        mark_negligible(tasks, 0.005)
        scheduler.release_unused(tasks[1])
    assert pool.status()["available"] == 4 and pool.status()["released"] == 4
    # without a key (one process, one life) every release counts
    plain = TrialPool(0)
    plain.release(3)
    plain.release(2)
    assert plain.status()["available"] == 5


def test_failed_trials_say_whether_they_built_and_why():
    """A quarter to a third of BERT-base's fp16 trials failed on the H100 and the report could not say
    whether at build or at run, nor why. Each task now counts the ones that never built and keeps the
    first error of each kind, as the line that says what went wrong (not the traceback around it)."""
    task = _tasks([10.0])[0]
    tvm_crash = ("tunekit BuildPool: build failed\nTraceback (most recent call last):\n"
                 '  File "/project/src/sym/int_set.cc", line 557, in IntervalSetEvaluator::Dispatch_\n'
                 "tvm.error.InternalError: Check failed: (eval_vec_) is false: \n")
    task.record(None, error=tvm_crash, at_build=True)
    task.record(None, error="tunekit BuildPool: build failed\nSubprocess terminated", at_build=True)
    task.record(None, error="RPCRunner: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested")
    task.record(8.0)
    assert (task.measured, task.failed, task.failed_build) == (4, 3, 2)
    assert task.first_errors == {
        "build": "tvm.error.InternalError: Check failed: (eval_vec_) is false:",
        "run": "RPCRunner: CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: too many resources requested"}
    assert error_line(None) == "(no error message)" and len(error_line("x" * 500)) == 200


def test_a_negligible_task_is_tuned_once_the_rest_of_the_model_is():
    """ResNet-18's 1x1 convs on a CPU core: 0.3% of the untuned model, 4% of it once its 3x3 convs were
    tuned 7x faster without them. A negligible task is reconsidered against the model as tuned so far."""
    tasks = _tasks([1000.0, 1000.0, 4.0])  # the last is 0.2% of the untuned model
    mark_negligible(tasks, 0.005)
    assert [t.negligible for t in tasks] == [False, False, True]
    scheduler = TaskScheduler(tasks, trials_per_iter=8, min_task_share=0.005)
    model_when_picked = []
    for _ in range(8):
        model_us = sum(t.effective_us for t in tasks)
        task = scheduler.next_task(set())
        if task.index == 2:
            model_when_picked.append(model_us)
        previous = task.effective_us
        for _ in range(8):
            task.record(previous * 0.5)
        task.after_batch(previous, fresh=8, cached=0)
    # it waited until the model was under 800 us (4 us is 0.5% of it), then was tuned
    assert model_when_picked and model_when_picked[0] <= 800 and tasks[2].measured >= 8
    assert not tasks[2].negligible
    # ... and without reconsidering (the rule before), it is never tuned
    before = _tasks([1000.0, 1000.0, 4.0])
    mark_negligible(before, 0.005)
    assert 2 not in _simulate(TaskScheduler(before, trials_per_iter=8), 8, lambda t: t.effective_us * 0.5)


def test_a_task_notes_when_its_latency_fell_and_to_what():
    """report tasks[].fell_at: benchmarks/fleet.py traces each model's estimated latency over a run from it."""
    task = TaskState(0, "conv", 1.0, untuned_us=10.0)
    for us in (12.0, 8.0, 9.0, 8.0, 5.0):  # slower than untuned, a fall, two that are not, a fall
        previous = task.effective_us
        task.record(us)
        task.after_batch(previous, fresh=1, cached=0)
    assert [us for _, us in task.fell_at] == [8.0, 5.0]
    assert task.fell_at[0][0] <= task.fell_at[1][0]
    unmeasured = TaskState(1, "dense", 1.0)  # no untuned time: its first result is its first fall
    unmeasured.record(7.0)
    unmeasured.after_batch(None, fresh=1, cached=0)
    assert [us for _, us in unmeasured.fell_at] == [7.0]


def test_a_kernel_of_another_kind_that_beats_the_task_is_a_fall_too():
    """A Triton kernel measured before the search lowers what the model runs: fell_at has it, so benchmarks/fleet.py's
    estimate of a transformer is not left at its untuned GEMMs while its kernels are already chosen."""
    task = TaskState(0, "matmul", 1.0, untuned_us=100.0)
    task.kernel_measured(120.0, "triton:slow")  # slower than the untuned kernel: nothing fell
    assert task.fell_at == []
    task.kernel_measured(40.0, "triton:m64n64")
    assert [us for _, us in task.fell_at] == [40.0] and task.kernel == "triton:m64n64"
    for us in (60.0, 30.0):  # a batch that does not beat the kernel, one that does
        previous = task.effective_us
        task.record(us)
        task.after_batch(previous, fresh=1, cached=0)
    assert [us for _, us in task.fell_at] == [40.0, 30.0]


def test_a_fleets_geometric_mean_sends_trials_to_the_fast_model_that_gains_most_for_its_size():
    """fleet_objective geomean (Ansor's f3): 20 µs off a 70 µs model beats 100 µs off a 1,800 µs one, which the
    weighted sum of latencies (the default) prefers."""
    def fleet():
        tasks = _tasks([1000.0, 1000.0, 100.0, 10.0], flops=[1.0] * 4)
        for task, bests in zip(tasks, ([900.0, 800.0], [1000.0, 1000.0], [80.0, 60.0], [10.0, 10.0])):
            _history(task, bests)
        return tasks
    models = [{0: 1.0, 1: 1.0}, {2: 1.0, 3: 1.0}]  # model A: tasks 0 and 1; model B: tasks 2 and 3
    by_sum = fleet()
    assert TaskScheduler(by_sum, trials_per_iter=8).next_task(set()).index in (0, 1)
    by_geomean = fleet()
    chosen = TaskScheduler(by_geomean, trials_per_iter=8,
                           reweigh=lambda tasks: fleet_priorities(tasks, models)).next_task(set())
    assert chosen.index == 2
    assert by_geomean[0].priority * 1800 == pytest.approx(by_geomean[2].priority * 70)  # each model's L x priority
    shared = fleet()
    fleet_priorities(shared, [{0: 1.0, 2: 1.0}, {1: 1.0, 2: 2.0, 3: 1.0}])  # task 2 in both, twice in the second
    l_a, l_b = 800 + 60, 1000 + 2 * 60 + 10
    mean = (l_a * l_b) ** 0.5
    assert shared[2].priority == pytest.approx((1 / l_a + 2 / l_b) / 3 * mean)
