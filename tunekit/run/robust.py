"""The share-robust artifact (`--robust`): one compiled model for all the listed shares.

Per task, the candidates are every record measured at every share (measure every share) and the
untuned kernel, each with a latency per share. One is chosen per task so that the whole model's
worst regret over the shares, estimated from its kernels' weighted sum, is smallest
(records.robust.model_robust_choice). The model compiled from the chosen
records is then measured at every share, beside every share's own artifact at every share: its
regret at a share is its latency there over the best of them there. The static choice is the one
of them all whose worst regret, as a whole model, is smallest (pick_robust_artifact): it is the
robust artifact's `main`, beside a variant per share (deploy.variants).
"""
from __future__ import annotations

from ..records.robust import model_robust_choice, robust_choice

UNTUNED = "untuned"
PER_TASK = "robust-per-task"  # the matrix's name for the model compiled from the per-task choice


def _latencies(db_dirs: dict) -> tuple[dict, dict]:
    """{workload key: {trace key: {share: us}}} over every share's records, and where each (workload key, trace
    key) was read: (its file's workload lines, workload index, record). Read from the lines (records.jsonl):
    opening each share's JSONDatabase parses every trial's trace (benchmarks/RESULTS.md, "open records"). A candidate measured at every share has the same trace in each file."""
    from ..records.baselines import key_of_hash
    from ..records.database import mean_run_us
    from ..records.jsonl import read_records, read_workloads

    table: dict = {}
    where: dict = {}
    for label, db_dir in db_dirs.items():
        workloads = read_workloads(db_dir)
        for line in read_records(db_dir):
            us = mean_run_us(line.run_secs)
            if us is None or not 0 <= line.workload < len(workloads) or workloads[line.workload] is None:
                continue
            wk, tk = key_of_hash(workloads[line.workload][0]), line.trace_text()
            table.setdefault(wk, {}).setdefault(tk, {})[label] = us
            where.setdefault((wk, tk), (workloads, line.workload, line.record))
    return table, where


def robust_records(db_dirs: dict, baselines: dict, weights: dict) -> tuple:
    """(a MemoryDatabase of the chosen records, one row per task, the estimate as a dict).
    `db_dirs`: share -> its database dir; `baselines`: share -> {workload key: untuned us};
    `weights`: workload key -> how often the model runs the task. Every candidate measured at every
    share can be chosen, not only a share's best: one good at both ends is often the best at neither."""
    from tvm.s_tir import meta_schedule as ms

    from ..records.database import parse_records

    shares = list(db_dirs)
    table, where = _latencies(db_dirs)
    tasks = {}
    for wk, traces in table.items():
        candidates = {tk: lat for tk, lat in traces.items() if all(s in lat for s in shares)}
        if all(baselines.get(s, {}).get(wk) for s in shares):
            candidates[UNTUNED] = {s: baselines[s][wk] for s in shares}
        if candidates:
            tasks[wk] = candidates
    chosen = ms.database.MemoryDatabase()
    model = model_robust_choice(tasks, weights, shares)
    if model is None:
        return chosen, [], None
    rows = []
    for wk, candidate in sorted(model.choice.items()):
        row = tasks[wk][candidate]
        best = {s: min(lat[s] for lat in tasks[wk].values()) for s in shares}
        regret = {s: round(row[s] / best[s], 4) for s in shares}
        rows.append({"workload_hash": wk, "weight": weights.get(wk, 1),
                     "chosen": "untuned" if candidate == UNTUNED else "record",
                     "candidates": len(tasks[wk]), "worst_regret": max(regret.values()), "regret": regret,
                     "us": {s: round(row[s], 3) for s in shares}})
        if candidate != UNTUNED:
            workloads, index, record = where[(wk, candidate)]
            (parsed,) = parse_records(workloads, [(index, record)]).get_all_tuning_records()
            chosen.commit_tuning_record(ms.database.TuningRecord(
                parsed.trace, chosen.commit_workload(parsed.workload.mod), parsed.run_secs, parsed.target,
                parsed.args_info))
    estimate = {"worst_regret": round(model.worst_regret, 4), "lower_bound": round(model.lower_bound, 4),
                "regret": {s: round(r, 4) for s, r in model.regret.items()},
                "best_kernel_sum_us": {s: round(b, 2) for s, b in model.best_sum.items()}}
    return chosen, rows, estimate


def regret_matrix(latency_ms: dict) -> dict:
    """`latency_ms`: artifact -> {share -> ms}, the share artifacts named by their share. Returns, per
    artifact, its regret at each share (over the best artifact there: issue 15's definition, the
    one pick_robust_artifact minimizes) and its worst one."""
    shares = [a for a in latency_ms if a in latency_ms.get(a, {})]
    best = {s: min(row[s] for row in latency_ms.values() if row.get(s)) for s in shares}
    out = {}
    for artifact, row in latency_ms.items():
        regret = {s: round(row[s] / best[s], 4) for s in shares if row.get(s)}
        out[artifact] = {"latency_ms": row, "regret": regret, "worst_regret": max(regret.values()) if regret else None}
    return out


def pick_robust_artifact(latency_ms: dict, shares: list[str]) -> str:
    """The artifact (a share's own, or PER_TASK) with the smallest worst regret over `shares`, as whole
    models measured at each share (`latency_ms`: artifact -> {share -> ms}). Ties go to the smaller
    total regret, then to PER_TASK; an artifact not measured at every share cannot be picked."""
    # robust_choice breaks full ties by key: the prefix puts PER_TASK first
    choice = robust_choice({f"{0 if name == PER_TASK else 1}:{name}": row for name, row in latency_ms.items()}, shares)
    return PER_TASK if choice is None else choice.candidate.split(":", 1)[1]
