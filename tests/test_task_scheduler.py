"""TaskScheduler and TaskState (clients/scheduler.py) on hand-made tasks: picking, per-task caps, what a task
takes from and gives back to the pool, stale batches. No TVM, no processes. The allocation rule itself
(warm-up, gradient, negligible tasks) is in test_scheduler.py."""
from tunekit.clients.scheduler import TaskScheduler, TaskState
from tunekit.coordinator.budget import TrialPool


def _task(index, weight, untuned_us, *, cap=100, measured=0, **kw):
    return TaskState(index=index, name=f"t{index}", weight=weight, untuned_us=untuned_us, cap=cap, budget=cap,
                     measured=measured, **kw)


def test_scheduler_picks_the_heaviest_weight_times_latency():
    # no task has had a batch yet (the warm-up): weight x latency decides
    tasks = [_task(0, 1, 100.0), _task(1, 3, 50.0), _task(2, 10, 5.0)]  # 100, 150, 50
    scheduler = TaskScheduler(tasks, trials_per_iter=4)
    assert scheduler.next_task(set()).index == 1
    assert scheduler.next_task({1}).index == 0  # a task with a batch in flight is skipped
    assert scheduler.next_task({0, 1}).index == 2
    assert scheduler.next_task({0, 1, 2}) is None
    tasks[1].exhausted = True
    assert scheduler.next_task(set()).index == 0  # an exhausted task is never picked
    tasks[0].best_us = 1.0  # the best record counts when faster than the untuned kernel: score 1
    assert scheduler.next_task(set()).index == 2


def test_scheduler_gives_every_task_a_first_batch_before_any_gets_a_second():
    heavy, light = _task(0, 10, 100.0), _task(1, 1, 10.0)
    scheduler = TaskScheduler([heavy, light], trials_per_iter=4)
    assert scheduler.next_task(set()) is heavy
    heavy.batches = 1
    assert scheduler.next_task(set()) is light  # not the heavy one again, however heavy


def test_scheduler_without_a_pool_stops_when_every_cap_is_spent():
    tasks = [_task(0, 1, 10.0, cap=4, measured=4), _task(1, 1, 10.0, cap=4, measured=3)]
    scheduler = TaskScheduler(tasks, trials_per_iter=4)
    assert scheduler.next_task(set()).index == 1
    tasks[1].measured = 4
    assert scheduler.next_task(set()) is None


def test_a_task_that_spent_its_cap_takes_from_the_pool_only_while_it_improves():
    improving = _task(0, 1, 100.0, cap=8, measured=8)                      # score 100, still improving
    stale = _task(1, 10, 100.0, cap=8, measured=8, stale_batches=1)         # score 500, stopped improving
    pool = TrialPool(10)
    scheduler = TaskScheduler([improving, stale], pool=pool, trials_per_iter=4)
    assert scheduler.next_task(set()) is improving
    assert (improving.cap, improving.extra, improving.budget) == (12, 4, 8)
    assert pool.available == 6 and pool.reassigned == 4
    assert stale.cap == 8 and stale.extra == 0
    # improving_only=False: the best by score asks, stale or not
    anyone = TaskScheduler([improving, stale], pool=pool, trials_per_iter=4, improving_only=False)
    improving.measured = 12
    assert anyone.next_task(set()) is stale and (stale.cap, stale.extra) == (12, 4) and pool.available == 2
    # the pool has less than a batch: the task gets what is left
    improving.stale_batches = 0
    stale.measured = 12
    assert scheduler.next_task(set()) is improving and improving.cap == 14 and pool.available == 0
    # an empty pool: nobody gets more, nothing changes
    improving.measured = 14
    assert scheduler.next_task(set()) is None and improving.cap == 14 and improving.extra == 6


def test_the_pool_is_asked_only_when_no_task_has_trials_left():
    spent = _task(0, 100, 100.0, cap=8, measured=8)
    open_ = _task(1, 1, 1.0, cap=8, measured=2)
    pool = TrialPool(10)
    scheduler = TaskScheduler([spent, open_], pool=pool, trials_per_iter=4)
    assert scheduler.next_task(set()) is open_ and pool.available == 10
    # a task with a batch in flight does not ask, nor an exhausted one, nor (improving_only) a stale one
    open_.measured = 8
    assert scheduler.next_task({0, 1}) is None and pool.available == 10
    open_.stale_batches = 2
    assert scheduler.next_task({0}) is None and pool.available == 10
    spent.exhausted = True
    assert scheduler.next_task(set()) is None and pool.available == 10
    assert open_.cap == 8 and spent.cap == 8 and open_.extra == spent.extra == 0


def test_release_unused_and_exhaust_give_back_cap_minus_measured():
    pool = TrialPool(0)
    task = _task(0, 1, 10.0, cap=10, measured=3)
    scheduler = TaskScheduler([task], pool=pool, trials_per_iter=4)
    scheduler.release_unused(task)
    assert pool.available == 7 and pool.released == 7 and task.cap == 3
    scheduler.release_unused(task)  # nothing left to give
    assert pool.available == 7 and pool.released == 7
    other = _task(1, 1, 10.0, cap=6, measured=1)
    scheduler.tasks.append(other)
    scheduler.exhaust(other)
    assert other.exhausted and other.cap == 1 and pool.available == 12 and pool.released == 12
    assert scheduler.next_task(set()) is not other
    # without a pool the cap stays (one global budget: nothing to give it to)
    alone = _task(2, 1, 10.0, cap=6, measured=1)
    TaskScheduler([alone], trials_per_iter=4).exhaust(alone)
    assert alone.exhausted and alone.cap == 6


def test_task_state_counts_stale_batches():
    task = _task(0, 1, None)
    task.record(80.0)
    task.record(None)
    assert (task.measured, task.failed, task.best_us) == (2, 1, 80.0)
    task.after_batch(None, fresh=2, cached=0)
    assert task.stale_batches == 0  # the first latency known: an improvement
    task.record(79.5)
    task.after_batch(80.0, fresh=1, cached=0)
    assert task.stale_batches == 1  # better by less than 1%: stale
    task.after_batch(79.5, fresh=1, cached=0)
    assert task.stale_batches == 2  # no better at all
    task.record(70.0)
    task.after_batch(79.5, fresh=1, cached=0)
    assert task.stale_batches == 0  # better by more than 1%: improving again
    task.after_batch(70.0, fresh=0, cached=3)
    assert task.stale_batches == 2 and task.cached == 3  # only known candidates proposed: converging
    slow_record = _task(1, 1, 50.0)
    slow_record.record(60.0)  # slower than the untuned kernel: what the model runs stays 50
    slow_record.after_batch(50.0, fresh=1, cached=0)
    assert slow_record.effective_us == 50.0 and slow_record.stale_batches == 1


def test_a_task_whose_triton_kernel_beats_the_searchs_best_gets_trials_only_after_the_others():
    """A GEMM whose Triton kernel (kernel_us) is far below MetaSchedule's best has nothing to gain from the next batch
    of the search; a lighter task the search can still improve goes first. Without a kernel the GEMM would win."""
    gemm = _task(0, 12, 100.0, best_us=30.0, batches=3, history=[40.0, 35.0, 30.0])
    norm = _task(1, 24, 5.0, best_us=4.5, batches=3, history=[5.0, 4.8, 4.5])
    scheduler = TaskScheduler([gemm, norm], trials_per_iter=4)
    assert scheduler.next_task(set()) is gemm  # 12 x 30 us still to win from
    gemm.kernel_us, gemm.history = 12.0, [12.0, 12.0, 12.0]  # the kernel was measured before the search began
    assert scheduler.next_task(set()) is norm
    gemm.best_us = 12.5  # the search is about to beat the kernel: worth its trials again
    assert scheduler.next_task(set()) is gemm


def test_the_warm_up_skips_a_task_whose_triton_kernel_already_beats_its_untuned_kernel():
    """ViT-B/16 at 40%, 48 trials (benchmarks/results/h200-transformers-triton-attention): fc1 (untuned 114 us, Triton
    10.7) and fc2 (110, 8.7) each took a warm-up batch of 16 and reached 32.6 us, so 32 trials bought nothing, while
    the patch conv (39.5 us) and the split-K sums got none. Such a task is searched once the others have had theirs
    and gain no more than it."""
    def vit(kernels: bool):
        return [_task(0, 12, 114.4, kernel_us=10.7 if kernels else None),
                _task(1, 12, 110.4, kernel_us=8.7 if kernels else None),
                _task(2, 23, 6.0), _task(3, 1, 39.5), _task(4, 11, 5.4)]

    def picks(tasks, n):
        scheduler, busy = TaskScheduler(tasks, trials_per_iter=16), []
        for _ in range(n):
            busy.append(scheduler.next_task(set(busy)).index)
        return busy

    assert picks(vit(kernels=False), 3) == [0, 1, 2]  # weight x latency
    assert picks(vit(kernels=True), 4) == [2, 4, 3, 0]  # the GEMMs last, when nothing else is free
    tasks = vit(kernels=True)
    for task, best in zip(tasks[2:], (5.0, 30.0, 4.6)):  # after their warm-up the others still gain
        task.record(best)
        task.after_batch(task.untuned_us, fresh=16, cached=0)
    assert TaskScheduler(tasks, trials_per_iter=16).next_task(set()).index in (2, 3, 4)
