"""The share-robust choice (issue 15): per task, the schedule whose worst regret over the shares is
smallest, where its regret at a share is its latency there over the best latency there.

Pure: latencies in, choice out. Every candidate must have been measured at every share (what
"measure every share" records); a candidate missing a share cannot be judged and is left out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class RobustChoice:
    candidate: str                 # the chosen candidate's key (a trace key, or "untuned")
    worst_regret: float            # max over shares of latency / best at that share (1.0 = best everywhere)
    regret: dict[str, float]       # share -> its regret there


def robust_choice(latency_us: dict[str, dict[str, float]], shares: list[str]) -> RobustChoice | None:
    """`latency_us`: candidate -> {share -> latency}. Minimizes the worst regret; ties go to the
    smallest total regret, then to the candidate key (deterministic)."""
    complete = {c: row for c, row in latency_us.items()
                if all(s in row and row[s] is not None and math.isfinite(row[s]) and row[s] > 0 for s in shares)}
    if not complete or not shares:
        return None
    best = {s: min(row[s] for row in complete.values()) for s in shares}
    scored = []
    for candidate, row in complete.items():
        regret = {s: row[s] / best[s] for s in shares}
        scored.append((max(regret.values()), sum(regret.values()), candidate, regret))
    worst, _, candidate, regret = min(scored)
    return RobustChoice(candidate, worst, regret)
