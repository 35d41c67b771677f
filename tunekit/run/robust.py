"""The share-robust artifact (`--robust`): one compiled model for all the listed shares.

Per task, the candidates are each share's best record and the untuned kernel; every one of them
was measured at every share (measure every share), so each has a latency per share. The chosen one
minimizes the worst regret over the shares (records.robust). The model compiled from the chosen
records is then measured at every share, beside every share's own artifact at every share: its
regret at a share is its latency there over the best of them there. The robust artifact is then
the one of them all whose worst regret, as a whole model, is smallest (pick_robust_artifact).
"""
from __future__ import annotations

from ..records.robust import robust_choice

UNTUNED = "untuned"
PER_TASK = "robust-per-task"  # the matrix's name for the model compiled from the per-task choice


def _latencies(databases: dict) -> dict:
    """{workload key: {trace key: {share: us}}} and the record of each trace, over every share's database."""
    from ..clients.search_loop import trace_key
    from ..records.baselines import workload_key
    from ..records.database import mean_run_us

    table: dict = {}
    records: dict = {}
    for label, database in databases.items():
        for record in database.get_all_tuning_records():
            us = mean_run_us(record.run_secs)
            if us is None:
                continue
            wk, tk = workload_key(record.workload.mod), trace_key(record.trace)
            table.setdefault(wk, {}).setdefault(tk, {})[label] = us
            records.setdefault((wk, tk), record)
    return table, records


def robust_records(databases: dict, baselines: dict) -> tuple:
    """(a MemoryDatabase of the chosen records, one row per task). `databases`: share -> its
    database; `baselines`: share -> {workload key: untuned us}."""
    from tvm.s_tir import meta_schedule as ms

    shares = list(databases)
    table, records = _latencies(databases)
    chosen = ms.database.MemoryDatabase()
    rows = []
    for wk, traces in table.items():
        candidates = {}
        for share in shares:  # each share's best trace (among those measured at every share)
            complete = {tk: lat for tk, lat in traces.items() if all(s in lat for s in shares)}
            if complete:
                best = min(complete, key=lambda tk: complete[tk][share])
                candidates[best] = complete[best]
        if all(wk in baselines.get(s, {}) for s in shares):
            candidates[UNTUNED] = {s: baselines[s][wk] for s in shares}
        choice = robust_choice(candidates, shares)
        if choice is None:
            continue
        rows.append({"workload_hash": wk, "chosen": "untuned" if choice.candidate == UNTUNED else "record",
                     "worst_regret": round(choice.worst_regret, 4),
                     "regret": {s: round(r, 4) for s, r in choice.regret.items()}})
        if choice.candidate != UNTUNED:
            record = records[(wk, choice.candidate)]
            chosen.commit_tuning_record(ms.database.TuningRecord(
                record.trace, chosen.commit_workload(record.workload.mod), record.run_secs, record.target,
                record.args_info))
    return chosen, rows


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
