"""Runner servers as Ray actors, placed on the node whose device they measure.

One `ShareFleet` actor holds the servers of one share on one device (a GPU, or a node's cores):
- GPU: one RunnerFleet (one tracker) with N servers, each process at the share's MPS percentage
  and on that GPU only (CUDA_VISIBLE_DEVICES);
- CPU: one RunnerFleet per server, each pinned to its own core set, so that servers of the same
  or of other shares never share a core.
One `MPSNode` actor per GPU node holds that node's MPS daemon: every share on the node uses the
same daemon (two daemons would fight over the GPU), and so do other tunekit jobs there (the
machine's ledger, shares/ledger.py: the daemon is stopped by the last job to leave). Ray's resource
requests only book the device; what limits a server physically is MPS (GPU) or its CPU affinity.
"""
from __future__ import annotations

import dataclasses
import os

from ..counts import sum_counts
from ..servers.fleet import FleetConfig, RunnerFleet
from ..shares.cpu import thread_env
from ..shares.pinning import PinnedEnv, pinned_env
from ..shares.share import Share


NODE_ADDRESS = "node"  # listen on the address other nodes reach this one at (Ray's node IP)


class ShareFleetImpl:
    def __init__(self, *, share_kind: str, pct: int, key: str, device: int | None, core_sets: list[list[int]],
                 servers: int, server_mode: str = "warm", mps_env: dict | None = None, host: str = "127.0.0.1",
                 secret: bytes | None = None, log_dir: str | None = None):
        """`host`: 127.0.0.1 when every client is on this machine; NODE_ADDRESS on a cluster of
        several machines (the tracker and servers then listen on this node's IP, which the servers
        also give the tracker, and demand `secret` from every client)."""
        if host == NODE_ADDRESS:
            import ray

            host = ray.util.get_node_ip_address()
        self.share = Share(share_kind, pct)
        self.key = key
        self.fleets: list[RunnerFleet] = []
        config = FleetConfig(servers=1, server_mode=server_mode, host=host, secret=secret, log_dir=log_dir)
        if share_kind == "gpu":
            pinned = pinned_env(self.share, mps_env=mps_env or {})
            pinned.env["CUDA_VISIBLE_DEVICES"] = str(device)
            self.fleets.append(RunnerFleet(key=f"{key}-gpu{device}", pinned=pinned,
                                           config=dataclasses.replace(config, servers=servers)))
        else:
            for j, cores in enumerate(core_sets):
                self.fleets.append(RunnerFleet(key=f"{key}-s{j}", pinned=PinnedEnv(self.share, thread_env(cores), cores),
                                               config=config))

    def start(self) -> list[dict]:
        """Start every tracker and server; returns where clients connect."""
        for fleet in self.fleets:
            fleet.start()
        return self.addresses()

    def addresses(self) -> list[dict]:
        return [{"host": f.config.connect_host, "port": f.tracker_port, "key": f.key, "sessions": f.config.servers,
                 "cores": f.pinned.cores} for f in self.fleets]

    def stop_server_on_port(self, port: int) -> bool:
        return any(fleet.stop_server_on_port(port) for fleet in self.fleets)

    def restarts(self) -> int:
        return sum(f.restarts for f in self.fleets)

    def fault_counts(self) -> dict:
        return sum_counts(fleet.fault_counts() for fleet in self.fleets)

    def server_pids(self) -> list[int]:
        return [pid for f in self.fleets for pid in f.server_pids]

    def stop(self) -> None:
        for fleet in self.fleets:
            fleet.stop()


class MPSNodeImpl:
    """The MPS daemon of one node, shared by all shares tuned there and by the other tunekit jobs of
    the node (shares.ledger.shared_mps): reused when one runs, stopped by the last job to leave."""

    def __init__(self):
        from ..shares.ledger import shared_mps

        self.daemon = shared_mps()

    def env(self) -> dict:
        return self.daemon.env()

    def stop(self) -> None:
        self.daemon.release()


def actor_classes():
    import ray

    return ray.remote(num_cpus=0)(ShareFleetImpl), ray.remote(num_cpus=0)(MPSNodeImpl)


def node_affinity(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)


def visible_gpus() -> list[int]:
    """Physical GPU indices this process may use (CUDA_VISIBLE_DEVICES, else all NVML sees)."""
    text = os.environ.get("CUDA_VISIBLE_DEVICES")
    if text:
        return [int(x) for x in text.split(",") if x.strip().isdigit()]
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return list(range(pynvml.nvmlDeviceGetCount()))
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return []
