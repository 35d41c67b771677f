"""One place that turns a Share into a process environment + pre-exec hook."""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from .cpu import thread_env
from .share import Share


@dataclass
class PinnedEnv:
    """Environment and CPU set for every process that runs at a share (servers, latency workers)."""

    share: Share
    env: dict[str, str] = field(default_factory=dict)
    cores: list[int] | None = None
    enforced: bool = True

    def popen_kwargs(self) -> dict:
        cores = self.cores

        def _pin():
            if cores:
                os.sched_setaffinity(0, cores)

        return {"env": {**os.environ, **self.env}, "preexec_fn": _pin}


# A GPU share's runner servers get one core of their own while tuning builds and searches beside them
# on every other core, from this many cores up (below it, the builds need the core more).
MEASUREMENT_CORE_FROM = 4


def measurement_cores(allowed: list[int]) -> list[int] | None:
    """The cores a GPU share's servers are pinned to while candidates build beside the measurement:
    the last of `allowed`, or None (unpinned) on a machine of fewer than MEASUREMENT_CORE_FROM cores.

    Why: a kernel of a few µs is timed by launching it back to back, so the timing includes any
    time the server's launching thread waits for a core. With builds on every core, a few candidates
    were recorded slower at a larger share than at a smaller one, and such records mislead the search
    and the share-robust choice. Pinning did not remove them, so busy cores are not their only cause
    (benchmarks/RESULTS.md, "measurement pinning"); it stays because it keeps the timing thread off
    cores the builds saturate."""
    allowed = sorted(allowed)
    return [allowed[-1]] if len(allowed) >= MEASUREMENT_CORE_FROM else None


def pinned_env(share: Share, *, mps_env: dict[str, str] | None = None, enforced: bool = True,
               cores: list[int] | None = None) -> PinnedEnv:
    """`cores`: a CPU share's cores (default: the first of this process's, share.cpu_cores())."""
    if share.kind == "cpu":
        cores = list(cores) if cores else share.cpu_cores()
        return PinnedEnv(share, thread_env(cores), cores)
    env = dict(mps_env or {})
    if enforced:
        # Only tightens the daemon's limit; without a daemon it does nothing (hence the SM check).
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(share.pct)
    return PinnedEnv(share, env, None, enforced)
