"""A tuned build past the numerics bound, when the untuned build is within it: some task's best record computes
the wrong thing (or does not build, or fails or hangs when the model runs). Find those records by group testing over the applied workloads (build with
half of them, check the outputs, recurse into the half that fails) and leave their tasks on the untuned kernel,
so one wrong kernel costs that task its tuning, not the run its artifact.

A run with c broken records among n applied ones costs about 2 c log2(n) extra builds; it happens only when
the tuned build was refused."""
from __future__ import annotations

import logging
from typing import Callable

log = logging.getLogger(__name__)


def broken_workloads(keys: list[str], passes: Callable[[list[str]], bool], *,
                     time_left: Callable[[], float] = lambda: float("inf")) -> list[str]:
    """The smallest set found of `keys` whose records break the build; `keys` together must fail `passes`
    (a build with only those records applied). When no part of a failing set fails alone, the set is returned
    whole: its records break the model only together. Once `time_left()` is <= 0, a set not yet searched is
    returned whole (a model whose probe builds are slow, with many broken records, keeps more tasks untuned
    rather than taking hours)."""
    if len(keys) <= 1:
        return list(keys)
    half = len(keys) // 2
    broken = []
    for part in (keys[:half], keys[half:]):
        if time_left() <= 0:
            broken += part  # not searched: left out whole
        elif not passes(part):
            broken += broken_workloads(part, passes, time_left=time_left)
    return broken or list(keys)


def mark_fallbacks(tasks: list[dict], broken: list[str], why: str) -> None:
    """Report rows: each broken workload's task kept its untuned kernel (tasks[].fallback), and why."""
    for row in tasks:
        if row.get("workload_hash") in broken:
            row["record_applied"] = False
            row["fallback"] = f"its tuned kernel broke the model: {why}"
