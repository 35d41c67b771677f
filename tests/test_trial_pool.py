"""The trial pool (coordinator/budget.py): what a draw gets, the last trials split over the clients, what is
given back, and a restarted client's settlement. No processes."""
from tunekit.clients.scheduler import TaskScheduler, TaskState
from tunekit.coordinator.budget import TrialPool


def _task(index, weight, untuned_us, *, cap=100, measured=0, **kw):
    return TaskState(index=index, name=f"t{index}", weight=weight, untuned_us=untuned_us, cap=cap, budget=cap,
                     measured=measured, **kw)


def test_pool_never_grants_more_than_it_holds():
    pool = TrialPool(5)
    assert pool.take(3) == 3 and pool.available == 2
    assert pool.take(10) == 2 and pool.available == 0  # only what is left
    assert pool.take(4) == 0 and pool.available == 0
    assert pool.take(-2) == 0 and pool.available == 0  # a negative wish takes nothing (and gives nothing)
    assert pool.reassigned == 5 and pool.released == 0


def test_the_pools_last_trials_are_split_over_its_takers():
    """With less than a batch per client left, each draw gets a part of it, so no client measures a last whole
    batch while the others are done; never under a quarter of a batch; whole batches while there is plenty."""
    pool = TrialPool(200, takers=8)
    assert pool.take(16) == 16  # 184 left: more than 8 batches' worth
    pool = TrialPool(40, takers=8)
    # ceil(left / 8), at least 4 (a quarter of 16), and the last 2 as they are
    assert [pool.take(16) for _ in range(10)] == [5, 5, 4, 4, 4, 4, 4, 4, 4, 2] and pool.available == 0
    assert TrialPool(40, takers=1).take(16) == 16  # one client: nothing to share
    pool = TrialPool(3, takers=8)
    assert pool.take(16) == 3 and pool.available == 0  # never more than it holds
    assert TrialPool(10, takers=4).take(2) == 2  # a part is at least a quarter of the batch asked for, at least 1


def test_in_the_pools_last_trials_a_client_with_a_long_pipeline_measures_it_before_drawing_more():
    """The pool ran dry while one client still had batches in flight and the others were done. In the last
    trials, a client whose pipeline holds its part of all that is left draws nothing until it measured; the
    others draw; the budget stays exact."""
    pool = TrialPool(40, takers=4)
    # a: 48 trials in flight; (40 + 48) / 4 = 22 each: a has more than its part
    assert pool.take(16, key="a", ahead=48) == 0 and pool.available == 40 and pool.status()["deferred"] == 1
    assert pool.take(16, key="b", ahead=0) == 10  # ceil(40 / 4): the usual part, b had nothing ahead
    assert pool.take(16, key="c", ahead=4) == 8  # ceil(30 / 4)
    assert set(pool.last_grants()) == {"b", "c"}  # when each client last drew (a deferred draw is none)
    assert pool.take(16, key="a", ahead=48) == 0  # ceil((22 + 48 + 10 + 12) / 4) = 23: still deferred
    pool.report(32, key="a")  # a measured two of its batches: 16 ahead, the pool hears it ...
    assert pool.take(16, key="a", ahead=16) == 0  # ... still not under ceil((22 + 16 + 10 + 12) / 4) = 15
    pool.report(16, key="a")
    assert pool.take(16, key="a", ahead=0) == 6  # nothing ahead: its part, ceil(22 / 4)
    pool.report(10, key="b")  # b measured its part and has nothing ahead: it draws again
    assert pool.take(16, key="b", ahead=0) == 4
    assert [pool.take(16, key=k, ahead=0) for k in "dbcd"] == [4, 4, 4, 0] and pool.available == 0
    assert pool.reassigned == 40 and pool.status()["deferred"] == 3
    # plenty left, or a client without a key (one process): whole batches, whatever is ahead
    assert TrialPool(200, takers=4).take(16, key="a", ahead=64) == 16
    assert TrialPool(40, takers=4).take(16, ahead=64) == 10
    # a client with nothing ahead always gets a part while the pool holds any: the run cannot stall
    pool = TrialPool(5, takers=4)
    pool.take(1, key="x", ahead=1000)
    assert pool.take(16, key="y", ahead=0) == 4


def test_pool_release_and_status():
    pool = TrialPool()
    assert pool.take(1) == 0
    pool.release(4)
    pool.release(-3)  # nothing to give back: ignored, never a negative pool
    assert pool.available == 4 and pool.released == 4
    assert pool.take(3) == 3
    pool.report(2)
    pool.report(1)
    assert pool.status() == {"available": 1, "released": 4, "reassigned": 3, "returned": 0, "measured": 3,
                             "deferred": 0}


def test_a_restarted_client_gives_back_what_its_predecessor_drew_and_never_measured():
    """A client that drew 8 pool trials died after measuring 3 of them (beyond its task's budget of 4,
    which the shard's records show as 7 measured): the 5 that died with it go back, once."""
    pool = TrialPool(20, takers=1)
    task = _task(0, 1, 10.0, cap=4, measured=4)
    first = TaskScheduler([task], pool=pool, trials_per_iter=4, pool_key="0")
    assert first.next_task(set()) is task and task.cap == 8
    task.measured = 8
    assert first.next_task(set()) is task and task.cap == 12 and pool.available == 12  # 2 draws of 4
    # the restart: budgets as planned, `measured` from the shard's records
    again = TaskScheduler([_task(0, 1, 10.0, cap=4, measured=7)], pool=pool, trials_per_iter=4, pool_key="0")
    assert again.settle_restart() == 5 and pool.available == 17 and pool.status()["returned"] == 5
    assert again.settle_restart() == 0 and pool.available == 17  # a second restart returns nothing more
    # another shard's draws are its own
    other = TaskScheduler([_task(0, 1, 10.0, cap=4, measured=4)], pool=pool, trials_per_iter=4, pool_key="1")
    other.next_task(set())
    assert pool.settle("1", 4) == 0 and pool.available == 13
