"""Compile a prepared Relax module with (or without) tuning records, and export the artifact."""
from __future__ import annotations

import os

def useful_records(database, baselines: dict[str, float] | None):
    """A database of the records worth applying: per workload, its best record, unless that is no
    faster than the untuned kernel (then the workload keeps the default schedule).

    Returns (database, {workload_key: applied?}).
    """
    from tvm.s_tir import meta_schedule as ms

    from ..records.baselines import workload_key
    from ..records.database import mean_run_us

    if not baselines:
        return database, {}
    kept = ms.database.MemoryDatabase()
    decisions: dict[str, bool] = {}
    workloads = {}
    for record in database.get_all_tuning_records():
        workloads.setdefault(workload_key(record.workload.mod), record.workload)
    for key, workload in workloads.items():
        top = database.get_top_k(workload, 1)
        if not top:
            continue
        best = top[0]
        baseline = baselines.get(key)
        best_us = mean_run_us(best.run_secs)
        apply = best_us is not None and (baseline is None or best_us < baseline)
        decisions[key] = apply
        if apply:
            kept.commit_tuning_record(ms.database.TuningRecord(
                best.trace, kept.commit_workload(workload.mod), best.run_secs, best.target, best.args_info))
    return kept, decisions


def apply_records(*, prepared_mod, target, database):
    """Replace every tuned TIR function with its best record; the rest stay for DLight/default.

    Not `ms.relax_integration.compile_relax`: in TVM 0.27 its artifact ran our tuned conv at the
    untuned speed (3458 us vs 735 us measured on the same records), so we apply the database to
    the module we extracted the tasks from, whose workload keys match by construction.
    """
    from tvm import relax

    with target, database:
        return relax.transform.MetaScheduleApplyDatabase()(prepared_mod)


def compile_and_export(*, prepared_mod, target, database, path: str, baselines: dict | None = None) -> str:
    import tvm

    if database is not None:
        database, _ = useful_records(database, baselines)
    mod = prepared_mod if database is None else apply_records(prepared_mod=prepared_mod, target=target,
                                                              database=database)
    # Untuned functions get the default pipeline (DLight schedules GPU kernels).
    executable = tvm.compile(mod, target=target)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp.so"
    executable.export_library(tmp)
    os.replace(tmp, path)  # never leave a half-written artifact under the final name
    return path
