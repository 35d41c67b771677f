"""Ray for the coordinator: join a cluster (--ray-address / RAY_ADDRESS) or start one here.

Started here it is the embedded default: nothing to install or start by hand, gone when the run
ends. Joined, only this driver disconnects at the end; the cluster stays.
"""
from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys

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
        # address="local": always a new cluster of our own. Without it ray.init() connects to any Ray
        # already running on the machine (another user's, another run's) and then refuses num_cpus.
        ray.init(address="local", num_cpus=len(os.sched_getaffinity(0)), num_gpus=gpu_count, include_dashboard=False,
                 log_to_driver=debug, logging_level=logging.WARNING, configure_logging=True)
        started = True
    reaper = _start_reaper() if started else None
    try:
        yield Cluster(started_here=started, address=address)
    finally:
        ray.shutdown()
        _stop_reaper(reaper)


# ---------------------------------------------------------------- reaper (issue 6, fault injection)
# A Ray started here fate-shares its raylet and gcs_server with this process, but when this process
# is SIGKILLed, Ray's per-node agents (ray::DashboardAgent, ray::RuntimeEnvAgent) log "raylet is
# dead, exiting" and then stay alive (seen for > 60 s with Ray 2.60: tests/test_faults_ray.py).
# The reaper is a small process of its own session that remembers this process's descendants
# (Ray's processes, the actors' workers, their trackers and servers) once a second; when this
# process goes away without saying goodbye on the pipe, it kills what is left of them.
def _start_reaper():
    try:
        return subprocess.Popen([sys.executable, "-m", "tunekit.coordinator.ray_runtime", "--reap", str(os.getpid())],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True)
    except OSError as exc:  # no reaper is no reason to fail a run
        log.debug("no reaper for the Ray processes: %s", exc)
        return None


def _stop_reaper(reaper) -> None:
    if reaper is None:
        return
    try:
        reaper.stdin.write(b"bye\n")  # a clean exit: Ray is shut down, nothing to reap
        reaper.stdin.close()
        reaper.wait(timeout=10)
    except Exception:
        reaper.kill()


def _reap(driver_pid: int) -> None:
    import select

    import psutil

    known: dict[int, float] = {}  # pid -> create time (a reused pid is not ours)
    me = os.getpid()
    while True:
        try:
            for proc in psutil.Process(driver_pid).children(recursive=True):
                if proc.pid != me:
                    known.setdefault(proc.pid, proc.create_time())
        except psutil.Error:
            pass
        ready, _, _ = select.select([sys.stdin], [], [], 1.0)
        if ready:
            line = sys.stdin.readline()
            if line.strip() == "bye":
                return
            if line == "":  # EOF without goodbye: the driver died
                break
    doomed = []
    for pid, created in known.items():
        try:
            proc = psutil.Process(pid)
            if proc.create_time() == created:
                proc.kill()
                doomed.append(proc)
        except psutil.Error:
            pass
    psutil.wait_procs(doomed, timeout=10)


if __name__ == "__main__" and sys.argv[1:2] == ["--reap"]:
    _reap(int(sys.argv[2]))
