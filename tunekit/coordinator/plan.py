"""Planning, with no Ray and no processes: per-task trial budgets, cost-balanced shards, share groups,
and server slots. Kept pure so every decision the coordinator makes can be tested and printed.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

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


@dataclass
class ServerSlot:
    """One runner server's place: which device (GPU index, or None on CPU) and which CPU cores."""

    share: Share
    device: int | None
    cores: list[int] | None = None
    node_id: str | None = None
    extra: dict = field(default_factory=dict)


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
