"""Planning, with no Ray and no processes: per-task trial budgets, cost-balanced shards, share groups,
and server slots. Kept pure so every decision the coordinator makes can be tested and printed.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

from ..errors import TunekitError
from ..shares.share import Share


@dataclass
class TaskPlan:
    index: int
    name: str
    weight: int
    flops: float
    budget: int = 0        # trials this task may measure before asking the shared pool for more
    client: int = -1

    @property
    def cost(self) -> float:
        # The estimate of tuning cost: FLOPs x weight x trials. FLOPs stand for the time a
        # candidate takes to build and run; weight for how much the task matters to the model.
        return max(self.flops, 1.0) * max(self.weight, 1) * self.budget


def allocate_trials(flops_weights: list[float], total: int) -> list[int]:
    """Split `total` trials over tasks: every task gets an even part (a small task still needs a few
    trials to find its schedule), the rest goes by FLOPs x weight (heavy kernels have more to gain).
    Exact: the parts sum to `total` (largest remainder)."""
    n = len(flops_weights)
    if n == 0:
        return []
    if total < n:
        # Fewer trials than tasks: one each for the heaviest tasks.
        order = sorted(range(n), key=lambda i: -flops_weights[i])
        return [1 if i in set(order[:total]) else 0 for i in range(n)]
    even = total // 2
    scores = [math.sqrt(max(fw, 1.0)) for fw in flops_weights]  # sqrt: do not starve mid-size tasks
    shares = [even / n + (total - even) * s / sum(scores) for s in scores]
    parts = [max(1, int(share)) for share in shares]
    while sum(parts) > total:  # max(1, ...) can overshoot when many shares are < 1
        j = max(range(n), key=lambda i: parts[i])
        parts[j] -= 1
    order = sorted(range(n), key=lambda i: shares[i] - int(shares[i]), reverse=True)
    k = 0
    while sum(parts) < total:
        parts[order[k % n]] += 1
        k += 1
    return parts


# Several clients: part of the trials starts in the share's pool instead of any task's budget, and goes
# to whichever client is free first. The budgets are balanced by estimated cost (FLOPs x weight x
# trials), but a trial's wall time hardly follows FLOPs: search, build and measurement cost about the
# same for a small task as for a large one, so clients of equal estimated cost finish far apart unless a
# pool evens them out (benchmarks/RESULTS.md, "coordinator reserve").
RESERVE_FRACTION = 0.5


def reserve_trials(total: int, *, tasks: int, clients: int, trials_per_iter: int,
                   fraction: float = RESERVE_FRACTION) -> int:
    """Trials the pool holds at the start (the rest is split into per-task budgets): `fraction` of
    `total` with two clients or more, none with one; never so many that a task's budget could not
    hold its first batch (the warm-up rule: every task is measured before any gets a second batch)."""
    if clients < 2 or total <= 0:
        return 0
    return max(0, min(int(total * fraction), total - tasks * max(1, trials_per_iter)))


def shard_tasks(plans: list[TaskPlan], clients: int) -> list[list[TaskPlan]]:
    """Longest-processing-time-first: the costliest task goes to the least-loaded client.
    Balanced by estimated cost, not by task count. Sets each plan's `client`."""
    if clients < 1:
        raise TunekitError(f"--clients must be at least 1, got {clients}")
    shards: list[list[TaskPlan]] = [[] for _ in range(min(clients, max(1, len(plans))))]
    loads = [0.0] * len(shards)
    for plan in sorted(plans, key=lambda p: (-p.cost, p.index)):
        target = min(range(len(shards)), key=lambda c: (loads[c], len(shards[c])))
        plan.client = target
        shards[target].append(plan)
        loads[target] += plan.cost
    return [sorted(shard, key=lambda p: p.index) for shard in shards]


def group_shares(shares: list[Share], *, servers: int, oversubscribe: bool) -> list[list[Share]]:
    """Shares that fit on a device together (sum of pct x servers <= 100) are tuned at the same time;
    the others wait for a later group. Refuses a share that alone needs more than the whole device."""
    for share in shares:
        if share.pct * servers > 100 and not oversubscribe:
            limit = 100 // share.pct
            raise TunekitError(f"{servers} servers at {share.pct}% need {share.pct * servers}% of the "
                               f"{'GPU' if share.kind == 'gpu' else 'CPU cores'}: at most {limit} fit without "
                               f"overlapping; use --servers {limit} or pass --oversubscribe")
    if oversubscribe:
        return [list(shares)]
    groups: list[list[Share]] = []
    used: list[int] = []
    for share in sorted(shares, key=lambda s: -s.pct):  # first-fit decreasing
        need = share.pct * servers
        for g, group in enumerate(groups):
            if used[g] + need <= 100:
                group.append(share)
                used[g] += need
                break
        else:
            groups.append([share])
            used.append(need)
    return [sorted(group, key=lambda s: s.pct) for group in groups]


def cpu_slots(group: list[Share], *, servers: int, available: list[int] | None = None) -> tuple[dict, bool]:
    """Disjoint core sets for every server of every share in a group tuned at the same time.
    Returns ({share label: [cores of server 0, cores of server 1, ...]}, overlapped): on a machine
    with fewer cores than the group needs (rounding up to one core each), sets wrap around and
    overlap, which the report says."""
    available = sorted(available if available is not None else os.sched_getaffinity(0))
    cursor = 0
    slots: dict[str, list[list[int]]] = {}
    for share in group:
        count = max(1, round(len(available) * share.pct / 100))
        slots[share.label] = []
        for _ in range(servers):
            slots[share.label].append([available[(cursor + i) % len(available)] for i in range(count)])
            cursor += count
    return slots, cursor > len(available)


# ---------------------------------------------------------------- where tuning clients go
# Tuning clients are CPU work (search, build); fleets are the device. `--client-nodes` says which Ray
# nodes take clients: "any" (Ray's SPREAD, the default), "cpu-only" (nodes without GPUs) or nodes
# that advertise a custom resource (`ray start --resources '{"tunekit_client": 1}'`). Nodes are
# rows of `ray.nodes()`.
ANY_NODE, CPU_ONLY = "any", "cpu-only"


def _has(node: dict, resource: str) -> bool:
    return node.get("Resources", {}).get(resource, 0) > 0


def node_cpus(node: dict) -> float:
    return float(node.get("Resources", {}).get("CPU", 0))


def client_nodes(nodes: list[dict], setting: str) -> list[dict]:
    """The alive nodes that may host tuning clients (every alive one for "any")."""
    alive = [n for n in nodes if n.get("Alive")]
    if setting == ANY_NODE:
        return alive
    if setting == CPU_ONLY:
        return [n for n in alive if not _has(n, "GPU")]
    return [n for n in alive if _has(n, setting)]


def cpu_fleet_nodes(nodes: list[dict], setting: str) -> list[dict]:
    """The nodes a CPU share's fleets go on: every alive node except those that advertise the
    client resource. A client node's cores are for building; measuring there would share them."""
    alive = [n for n in nodes if n.get("Alive")]
    if setting in (ANY_NODE, CPU_ONLY):
        return alive
    return [n for n in alive if not _has(n, setting)]


def place_clients(nodes: list[dict], count: int, busy: dict | None = None) -> list[str]:
    """A node id for each of `count` new clients: each goes to the node with the fewest clients
    per CPU so far (`busy`: node id -> clients already there), ties to the earlier node."""
    if not nodes:
        raise TunekitError("no node to place tuning clients on")
    load = {n["NodeID"]: (busy or {}).get(n["NodeID"], 0) for n in nodes}
    placed = []
    for _ in range(count):
        best = min(nodes, key=lambda n: (load[n["NodeID"]] + 1) / max(node_cpus(n), 1.0))
        load[best["NodeID"]] += 1
        placed.append(best["NodeID"])
    return placed


def build_workers_for(cores: int, node_cpu: float, clients_on_node: int) -> int:
    """Build workers of one client: the cores of its node (Ray's CPU count for it, when smaller than
    the cores the client may run on) split over the clients on that node."""
    usable = min(cores, int(node_cpu)) if node_cpu >= 1 else cores
    return max(1, usable // max(1, clients_on_node))
