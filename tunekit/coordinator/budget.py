"""The shared trial pool of one share: where unused trials go, and where improving tasks find more.

Every task starts with its own budget (coordinator.plan.allocate_trials). A task whose search space
is exhausted, or a client that stops early, releases what it did not use; a task that has spent
its budget and still improves takes from the pool. The total `--trials` budget therefore holds
exactly. The pool also counts the trials clients report, which drives the progress bar.
"""
from __future__ import annotations

import threading
import time


class TrialPool:
    """In-process pool (tests, single client). The Ray actor below wraps the same logic.

    `takers`: the clients that draw from it. While it holds less than a batch for each of them, a draw
    gets its part of what is left (never under a quarter of the batch asked for), not a whole batch: the
    client that drew the last whole batch measured it alone while the others sat done.

    In those last trials a draw also says how many trials its client has `ahead` (proposed, not yet
    measured: up to pipeline_depth batches). A client whose pipeline already holds its part of all that
    is left, in the pool and ahead of every client, gets nothing (`deferred`) and measures what it has
    first; the trials go to clients with shorter pipelines, so the clients end closer together."""

    def __init__(self, available: int = 0, *, takers: int = 1):
        self._lock = threading.Lock()
        self.takers = max(1, int(takers))
        self.available = int(available)
        self.released = 0      # trials given back by tasks that could not use them
        self.reassigned = 0    # trials taken from the pool by tasks that still improve
        self.measured = 0
        self._released_by: dict[str, int] = {}  # key -> the total it declared given back so far
        self._drawn_by: dict[str, int] = {}  # key (a client's shard) -> what it took and may not have measured
        self.returned = 0  # trials a dead client had taken and not measured, given back when it restarted
        # key -> trials its client had ahead at its last draw, plus what it was granted, less what it
        # reported measured since: each client's pipeline as the pool last heard of it
        self._ahead: dict[str, int] = {}
        self.deferred = 0  # draws refused because the client's pipeline held more than its part
        self._last_grant: dict[str, float] = {}  # key -> when (time.time()) it was last granted trials

    def take(self, wanted: int, key: str | None = None, ahead: int = 0) -> int:
        with self._lock:
            wanted = int(wanted)
            if key is not None:
                self._ahead[key] = max(0, int(ahead))
            if 0 < self.available < wanted * self.takers:  # the last trials: a part for each taker
                if key is not None and self._ahead[key] > 0 and self._ahead[key] >= self._fair_part():
                    self.deferred += 1
                    return 0
                wanted = min(wanted, max(-(-self.available // self.takers), -(-wanted // 4)))
            granted = max(0, min(wanted, self.available))
            self.available -= granted
            self.reassigned += granted
            if key is not None:
                self._drawn_by[key] = self._drawn_by.get(key, 0) + granted
                self._ahead[key] += granted
                if granted:
                    self._last_grant[key] = time.time()
            return granted

    def _fair_part(self) -> int:
        """What each taker would still measure if what is left, in the pool and in every pipeline, were
        shared evenly (a client not yet heard of counts as having nothing ahead)."""
        return -(-(self.available + sum(self._ahead.values())) // self.takers)

    def settle(self, key: str, used: int) -> int:
        """A client restarted on its shard: of what its predecessors took under `key`, `used` trials are
        in the shard's records (measured beyond the tasks' own budgets). The rest died with the client
        unmeasured and goes back, or the run would measure less than --trials. Returns what went back."""
        with self._lock:
            back = max(0, self._drawn_by.get(key, 0) - max(0, int(used)))
            self._drawn_by[key] = self._drawn_by.get(key, 0) - back
            self.available += back
            self.returned += back
            return back

    def release(self, count: int, key: str | None = None) -> None:
        """Give `count` trials back. With `key` (a client's task), `count` is the total that key has
        given back so far, and only what is new is added: a client restarted on its shard recomputes
        the same unused budgets its predecessor already gave back, and they must not count twice."""
        with self._lock:
            count = max(0, int(count))
            if key is not None:
                before = self._released_by.get(key, 0)
                self._released_by[key] = max(before, count)
                count = max(0, count - before)
            self.available += count
            self.released += count

    def report(self, measured: int, key: str | None = None) -> None:
        with self._lock:
            self.measured += int(measured)
            if key is not None and key in self._ahead:  # measured: no longer ahead of that client
                self._ahead[key] = max(0, self._ahead[key] - int(measured))

    def last_grants(self) -> dict[str, float]:
        """When each client last drew trials (time.time()): what it did after is the run's tail."""
        with self._lock:
            return dict(self._last_grant)

    def status(self) -> dict:
        with self._lock:
            return {"available": self.available, "released": self.released, "reassigned": self.reassigned,
                    "returned": self.returned, "measured": self.measured, "deferred": self.deferred}


def ray_pool_class():
    """The Ray actor class (defined lazily: importing tunekit must not import Ray)."""
    import ray

    @ray.remote(num_cpus=0)
    class RayTrialPool(TrialPool):
        pass

    return RayTrialPool


class RemotePool:
    """What a tuning client holds: the same calls as TrialPool, made on the Ray actor."""

    def __init__(self, handle):
        self.handle = handle

    def take(self, wanted: int, key: str | None = None, ahead: int = 0) -> int:
        import ray

        return ray.get(self.handle.take.remote(wanted, key, ahead))

    def settle(self, key: str, used: int) -> int:
        import ray

        return ray.get(self.handle.settle.remote(key, used))

    def release(self, count: int, key: str | None = None) -> None:
        import ray

        ray.get(self.handle.release.remote(count, key))

    def report(self, measured: int, key: str | None = None) -> None:
        # fire and forget: progress, and the pipeline the pool balances; Ray runs one caller's calls on an
        # actor in order, so the pool hears of a measurement before the client's next draw
        self.handle.report.remote(measured, key)
