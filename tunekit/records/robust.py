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


@dataclass(frozen=True)
class ModelRobustChoice:
    choice: dict[str, str]             # task -> its chosen candidate's key
    worst_regret: float                # the estimated whole model's: max over shares of its kernel sum / the best sum
    regret: dict[str, float]           # share -> the estimated model's regret there
    best_sum: dict[str, float]         # share -> sum over tasks of weight x the best latency there
    lower_bound: float                 # no choice from these candidates has a smaller worst regret (the dual's)


def model_robust_choice(tasks: dict[str, dict[str, dict[str, float]]], weights: dict[str, float],
                        shares: list[str], grid: int = 40) -> ModelRobustChoice | None:
    """Per task one candidate, so that the whole model's worst regret over the shares is smallest.

    `tasks`: task -> candidate -> {share -> latency}; `weights`: task -> how often the model runs it
    (missing: 1). The model's time at a share is estimated as the weighted sum of its kernels' times
    there, and its regret there as that sum over the sum of each task's best at that share.

    Why not per task: a task's own worst regret says nothing about which share the rest of the model
    loses at; letting small tasks lose where the big ones win gives a smaller worst regret for the
    whole model (benchmarks/RESULTS.md, "share-robust choice"). Minimizing a max of sums is a small
    integer program: enumerated when small, otherwise solved by its Lagrangian (_lagrangian).
    """
    import numpy as np

    names, matrices, w = [], [], []
    for task in sorted(tasks):
        complete = sorted(c for c, row in tasks[task].items()
                          if all(s in row and row[s] is not None and math.isfinite(row[s]) and row[s] > 0
                                 for s in shares))
        if complete:
            names.append((task, complete))
            matrices.append(np.array([[tasks[task][c][s] for s in shares] for c in complete], dtype=float))
            w.append(float(weights.get(task, 1)))
    if not names or not shares:
        return None
    best_sum = sum(wt * m.min(axis=0) for wt, m in zip(w, matrices))       # per share
    scaled = [wt * m / best_sum for wt, m in zip(w, matrices)]              # each row: its share of each regret
    if math.prod(len(m) for m in scaled) <= EXACT_UP_TO:
        choice, total = _exhaustive(scaled)
    else:
        choice, total = _lagrangian(scaled, len(shares), grid)
    return ModelRobustChoice({task: cands[c] for (task, cands), c in zip(names, choice)},
                             float(total.max()), {s: float(r) for s, r in zip(shares, total)},
                             {s: float(b) for s, b in zip(shares, best_sum)},
                             min(float(total.max()), _dual_bound(scaled, len(shares))))


EXACT_UP_TO = 20_000  # choices enumerated outright; a real model (tens of tasks) is far past it


def _exhaustive(scaled: list) -> tuple:
    import itertools

    import numpy as np

    best = None
    for choice in itertools.product(*(range(len(m)) for m in scaled)):
        total = sum(m[j] for m, j in zip(scaled, choice))
        if best is None or _lower((total.max(), total.sum()), (best[1].max(), best[1].sum())):
            best = (list(choice), np.asarray(total))
    return best


def _lagrangian(scaled: list, n_shares: int, grid: int) -> tuple:
    """For share weights lambda on the simplex (a grid), each task independently takes the candidate
    with the smallest lambda-weighted regret; the best of those choices (or each task's own minimax
    choice, if better) is then improved one task at a time while a single swap lowers the worst regret.
    With many tasks this is near the optimum: the duality gap of a sum of many small terms is about
    n_shares tasks' worth at most (Shapley-Folkman). MobileNetV2's records: 1.0807, against the
    dual's lower bound of 1.0786.
    """
    import numpy as np

    lam = np.array(list(_simplex(n_shares, grid)))                        # points x shares
    regret = np.zeros((len(lam), n_shares))
    picks = []
    for m in scaled:
        pick = np.argmin(m @ lam.T, axis=0)                                  # per point, ties to the first
        picks.append(pick)
        regret += m[pick]
    point = int(np.lexsort((regret.sum(axis=1), regret.max(axis=1)))[0])
    choice = [int(p[point]) for p in picks]
    total = regret[point].copy()
    # Also start from each task's own minimax choice, so the result is never worse than the per-task rule.
    own = [int(np.lexsort(((m / m.min(axis=0)).sum(axis=1), (m / m.min(axis=0)).max(axis=1)))[0]) for m in scaled]
    own_total = sum(m[j] for m, j in zip(scaled, own))
    if _lower((own_total.max(), own_total.sum()), (total.max(), total.sum())):
        choice, total = own, own_total
    improved = True
    while improved:  # single swaps; each strictly lowers (worst, sum of regrets), so this ends
        improved = False
        for i, m in enumerate(scaled):
            trial = total - m[choice[i]] + m                                 # candidates x shares
            score = np.stack([trial.max(axis=1), trial.sum(axis=1)], axis=1)
            j = int(np.lexsort((score[:, 1], score[:, 0]))[0])
            if _lower((score[j, 0], score[j, 1]), (total.max(), total.sum())):
                choice[i], total, improved = j, trial[j], True
    return choice, total


def _dual_bound(scaled: list, n_shares: int, grid: int = 100) -> float:
    """A lower bound on any choice's worst regret: for share weights lambda summing to 1, the worst
    regret is at least the lambda-weighted one, whose minimum splits into each task's own minimum. It
    tells a user when the target cannot be met from these candidates, whatever the rule."""
    import numpy as np

    lam = np.array(list(_simplex(n_shares, grid if n_shares <= 3 else 20)))
    return float(sum((m @ lam.T).min(axis=0) for m in scaled).max())


def _lower(a: tuple, b: tuple, eps: float = 1e-12) -> bool:
    """(worst, total) a below b by more than float noise: worst first, then total."""
    return a[0] < b[0] - eps or (abs(a[0] - b[0]) <= eps and a[1] < b[1] - eps)


def _simplex(n: int, grid: int):
    """Every point of the n-simplex whose coordinates are multiples of 1/grid."""
    def parts(n, total):  # every way to write total as n non-negative integers
        if n == 1:
            yield (total,)
            return
        for i in range(total + 1):
            for rest in parts(n - 1, total - i):
                yield (i, *rest)
    for point in parts(n, grid):
        yield tuple(i / grid for i in point)
