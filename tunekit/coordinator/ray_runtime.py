"""Ray for the coordinator: join a cluster (--ray-address / RAY_ADDRESS) or start one here.

Started here it is the embedded default: nothing to install or start by hand, gone when the run
ends. Joined, only this driver disconnects at the end; the cluster stays.
"""
from __future__ import annotations

import contextlib
import logging
import os

from ..errors import TunekitError

log = logging.getLogger("tunekit.ray")


class Cluster:
    def __init__(self, *, started_here: bool, address: str | None):
        self.started_here = started_here
        self.address = address

    def describe(self) -> dict:
        import ray

        nodes = [n for n in ray.nodes() if n.get("Alive")]
        return {"ray": {"started_here": self.started_here, "address": self.address, "nodes": len(nodes),
                        "cpus": ray.cluster_resources().get("CPU", 0), "gpus": ray.cluster_resources().get("GPU", 0)}}


@contextlib.contextmanager
def connect(*, address: str | None = None, gpus: list[int] | None = None, debug: bool = False):
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or None
    if ray.is_initialized():  # the caller (a notebook, a test) already holds a connection: use it
        yield Cluster(started_here=False, address=address)
        return
    if address:
        try:
            ray.init(address=address, log_to_driver=debug, logging_level=logging.WARNING)
        except Exception as exc:
            raise TunekitError(f"could not join the Ray cluster at {address}: {str(exc).splitlines()[0][:200]}") from None
        started = False
    else:
        # Token auth writes ~/.ray/auth_token and refuses unauthenticated local workers; a cluster
        # that lives only inside this run and listens on this machine does not need it.
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
        from .fleet_actor import visible_gpus

        gpu_count = len(visible_gpus())
        ray.init(num_cpus=len(os.sched_getaffinity(0)), num_gpus=gpu_count, include_dashboard=False,
                 log_to_driver=debug, logging_level=logging.WARNING, configure_logging=True)
        started = True
    try:
        yield Cluster(started_here=started, address=address)
    finally:
        ray.shutdown()
