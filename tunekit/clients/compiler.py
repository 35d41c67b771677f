"""Compile a prepared Relax module with (or without) tuning records, and export the artifact."""
from __future__ import annotations

import os

from . import task_faults
from .build_config import NO_STORAGE_REWRITE


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


def records_for(database, keys: list[str]):
    """A database of `database`'s records of the workloads in `keys` (records.baselines.workload_key)."""
    from tvm.s_tir import meta_schedule as ms

    from ..records.baselines import workload_key

    wanted, kept = set(keys), ms.database.MemoryDatabase()
    for record in database.get_all_tuning_records():
        if workload_key(record.workload.mod) in wanted:
            kept.commit_tuning_record(ms.database.TuningRecord(
                record.trace, kept.commit_workload(record.workload.mod), record.run_secs, record.target,
                record.args_info))
    return kept


def kernels_worth_applying(db_dir: str, database) -> dict:
    """{workload key: KernelRecord} of the tasks whose fastest kernel of another kind (records.kernel_records), its
    output right at the share, beats both `database`'s best record of the task and its untuned kernel."""
    from ..records import kernel_records
    from ..records.baselines import read_baselines, workload_key
    from ..records.database import mean_run_us

    kernels = kernel_records.best_checked(db_dir)
    if not kernels:
        return {}
    beat = dict(read_baselines(db_dir))  # the untuned kernel's time, then the best record's where faster
    if database is not None:
        for record in database.get_all_tuning_records():
            us = mean_run_us(record.run_secs)
            key = workload_key(record.workload.mod)
            if us is not None and us < beat.get(key, float("inf")):
                beat[key] = us
    return {key: record for key, record in kernels.items() if record.mean_us < beat.get(key, float("inf"))}


def fused_kernel_rows(db_dir: str, kernels: dict, task_keys: set) -> list[dict]:
    """Report rows of the tasks that are not searched (fused attention) and have kernel records at the share: the
    kernel the build takes (`kernels`, kernels_worth_applying's) beside the hand-written kernel's time."""
    from ..kernels.candidates import HANDWRITTEN
    from ..records import kernel_records

    handwritten = {r.workload: r.mean_us for r in kernel_records.read(db_dir)
                   if r.kind == HANDWRITTEN and r.checked and r.mean_us is not None}
    rows = []
    for key in sorted(set(handwritten) - task_keys):
        chosen = kernels.get(key)
        row = {"workload_hash": key, "handwritten_us": round(handwritten[key], 3), "kernel": HANDWRITTEN}
        if chosen is not None and chosen.kind != HANDWRITTEN:
            row.update(kernel=chosen.kind, kernel_config=chosen.config, kernel_us=round(chosen.mean_us, 3))
        rows.append(row)
    return rows


def with_kernels(mod, kernels: dict, *, target):
    """`mod` (prepared, before any record is applied: the tasks are matched by their workload keys) with the tasks
    of `kernels` ({workload key: KernelRecord}) computed by those kernels. Where the kernels cannot be built here
    (TVM's CUDA runtime is not linked in on a machine without the driver), `mod` as it is, and a warning."""
    import logging

    import tvm_ffi

    from ..kernels.candidates import KIND, with_kernels as with_kernels_of_kind

    triton = {key: r.config for key, r in kernels.items() if r.kind == KIND}
    if not triton:
        return mod
    if tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is None:
        logging.getLogger("tunekit").warning("%d Triton kernels measured best are not built in: this machine's TVM "
                                             "has no CUDA runtime; their tasks take MetaSchedule's", len(triton))
        return mod
    return with_kernels_of_kind(mod, triton, target=target)[0]


def records_worth_applying(db_dir: str, *, create: bool = True):
    """`useful_records` of a share's database dir, against the untuned baselines kept beside it."""
    from ..records.baselines import read_baselines
    from ..records.database import open_best_records

    return useful_records(open_best_records(db_dir, create=create), read_baselines(db_dir))


def apply_records(*, prepared_mod, target, database):
    """Replace every tuned TIR function with its best record; the rest stay for DLight/default.

    Not `ms.relax_integration.compile_relax`: in TVM 0.27 its artifact ran our tuned conv at the
    untuned speed (3458 us vs 735 us measured on the same records), so we apply the database to
    the module we extracted the tasks from, whose workload keys match by construction.
    """
    from tvm import relax

    with target, database:
        return relax.transform.MetaScheduleApplyDatabase()(prepared_mod)


def uses_cuda_graphs(target) -> bool:
    """GPU artifacts replay their kernels from a captured CUDA graph: ResNet-18 at batch 1 is a few
    dozen short kernels, and their launch gaps are a large part of its time (benchmarks/RESULTS.md,
    "CUDA graphs")."""
    return target.kind.name == "cuda"


def compile_and_export(*, prepared_mod, target, database, path: str, baselines: dict | None = None,
                       cuda_graph: bool | None = None, kernels: dict | None = None) -> str:
    """Apply the records worth applying, compile (with CUDA graphs on a GPU unless `cuda_graph` is
    False) and export a linked library to `path` atomically. `kernels`: {workload key: KernelRecord} of tasks
    computed by kernels of another kind (kernels_worth_applying), put in before the records."""
    if kernels:
        prepared_mod = with_kernels(prepared_mod, kernels, target=target)
    if database is not None:
        database, _ = useful_records(database, baselines)
    mod = prepared_mod if database is None else apply_records(prepared_mod=prepared_mod, target=target,
                                                              database=database)
    if database is not None:
        mod = task_faults.faulty_kernels(mod)  # tests only (TUNEKIT_INJECT_TASK_FAULT=wrong_kernel:...)
    return _build_and_export(mod, target=target, path=path, tuned=database is not None, cuda_graph=cuda_graph)


def compile_variants_and_export(*, variants: dict, default: str, target, path: str,
                                kernels: dict | None = None) -> str:
    """The share-robust artifact: `variants` {label: (prepared module, database of the records to
    apply)} merged into one module (clients.share_variants), entries `main__<label>`, `main` the
    `default` one, compiled once and exported to `path`. `kernels`: {label: {workload key: KernelRecord}} of
    the variants whose tasks run kernels of another kind (kernels_worth_applying at that share)."""
    from .share_variants import merge_variants

    kernels = kernels or {}
    modules = {label: apply_records(prepared_mod=with_kernels(prepared, kernels[label], target=target)
                                    if kernels.get(label) else prepared, target=target, database=database)
               for label, (prepared, database) in variants.items()}
    return _build_and_export(merge_variants(modules, default=default), target=target, path=path, tuned=True,
                             cuda_graph=None)


def _build_and_export(mod, *, target, path: str, tuned: bool, cuda_graph: bool | None) -> str:
    import tvm

    graphs = uses_cuda_graphs(target) if cuda_graph is None else cuda_graph
    if target.kind.name == "cuda":
        # Registers tvm_callback_cuda_compile: the artifact carries cubins compiled here by NVRTC, so
        # loading it (the latency worker, tunekit.load) compiles nothing. Without it every load ran
        # NVRTC over every kernel. The same compile as the candidates' (clients.cuda_compile).
        from .cuda_compile import install as install_cuda_compile

        install_cuda_compile()
    # Untuned functions get the default pipeline (DLight schedules GPU kernels). The CUDA-graph
    # rewrite runs in that pipeline and reads its switch from the PassContext (which
    # ms.relax_integration.compile_relax would drop: it opens a PassContext of its own). A tuned
    # tensor-core kernel may need the storage-rewrite workaround its candidate was built with
    # (clients.build_config.NO_STORAGE_REWRITE): tried when the plain build fails.
    configs = [{}, NO_STORAGE_REWRITE] if target.kind.name == "cuda" and tuned else [{}]
    for attempt, extra in enumerate(configs):
        try:
            # `with target`: NVRTC takes the architecture from the current target
            with target, tvm.transform.PassContext(config={"relax.backend.use_cuda_graph": bool(graphs), **extra}):
                executable = tvm.compile(mod, target=target)
            break
        except Exception:
            if attempt == len(configs) - 1:
                raise
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp.so"
    executable.export_library(tmp)
    os.replace(tmp, path)  # never leave a half-written artifact under the final name
    return path
