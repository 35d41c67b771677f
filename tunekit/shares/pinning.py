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
