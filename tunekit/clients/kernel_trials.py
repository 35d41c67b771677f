"""Kernels of another kind than MetaSchedule's, tried for a tuning loop's tasks (issue 53).

Each GEMM task (kernels.gemm_plan) gets one candidate per Triton tile configuration that fits it
(kernels.triton_gemm.tile_configs), each fused attention (never searched: scheduled_tasks) one per Triton flash
configuration (kernels.triton_attention), and its hand-written kernel is measured beside them (HANDWRITTEN), so a
Triton kernel is chosen only where it beats it. A candidate is built by the build pool, beside the task's own kernel, then run on
the share's runner servers like any trial: checked there against the task's kernel on the same inputs
(clients.session_runner.REFERENCE), then timed. Every outcome goes into the share's kernel records
(records.kernel_records), so a resumed run measures nothing twice. The final compile picks each task's kernel by
measured time at that share (clients.compiler.kernels_worth_applying).
"""
from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass

from ..errors import error_line
from ..records import kernel_records
from ..records.kernel_records import KernelRecord

log = logging.getLogger("tunekit.kernels")


@dataclass
class ScheduledTask:
    """A task built as it is, never searched (a fused attention), that kernels of another kind may replace."""
    index: int
    name: str
    ctx: object       # .mod: the task's IRModule
    negligible: bool = False

    def cost_in_model(self) -> float:
        return float("inf")  # unknown until its hand-written kernel is measured, among its own trials


def scheduled_tasks(extracted: list, *, first_index: int) -> list[ScheduledTask]:
    """The already-scheduled tasks of `extracted` (MetaSchedule's ExtractedTasks) that have kernels of another kind,
    numbered from `first_index` (after the searched tasks)."""
    from types import SimpleNamespace

    from ..frontend.tasks import already_scheduled
    from ..kernels.candidates import needs_baseline

    import tvm

    found = [t for t in extracted if already_scheduled(t) and needs_baseline(t.dispatched[0]["main"])]
    # keyed as the compile matches the function in the prepared module (kernels.in_module.task_key): extraction
    # keeps a hand-written kernel's own global symbol
    return [ScheduledTask(first_index + i, t.task_name, SimpleNamespace(mod=tvm.IRModule(
        {"main": t.dispatched[0]["main"].with_attr("global_symbol", "main")}))) for i, t in enumerate(found)]


def kind_of(config: str) -> str:
    from ..kernels.candidates import HANDWRITTEN, KIND

    return HANDWRITTEN if config == HANDWRITTEN else KIND


@dataclass
class KernelTrial:
    task: object      # the search loop's TaskState
    workload: str
    config: str
    func: object      # the task's PrimFunc
    path: str | None = None
    error: str | None = None


def available(target) -> bool:
    """Triton candidates can be built here for `target`: a CUDA target, Triton installed, and TVM's CUDA runtime
    (a machine without the driver, a Ray client on a CPU node, cannot make the kernel's module)."""
    import tvm_ffi

    return target.kind.name == "cuda" and importlib.util.find_spec("triton") is not None and \
        tvm_ffi.get_global_func("ffi.Module.create.cuda", allow_missing=True) is not None


# Each task's first candidates, before any task's others: the configurations most often best (kernels' lists put
# them first), so a time budget that runs out still leaves every heavy task its likely winner
FIRST_ROUND = 4


def plan_trials(tasks: list, *, target, records_dirs: dict[str, str]) -> list[KernelTrial]:
    """The candidates of `tasks` (TaskStates, ScheduledTasks) not yet in every share's kernel records: each task's
    first FIRST_ROUND (a fused attention's hand-written kernel first among them), then the rest, the tasks that cost
    the model most first in each round. A time budget that runs out leaves the lighter ones to MetaSchedule."""
    per_task = _candidates(tasks, target=target, records_dirs=records_dirs)
    return [t for c in per_task for t in c[:FIRST_ROUND]] + [t for c in per_task for t in c[FIRST_ROUND:]]


def _candidates(tasks: list, *, target, records_dirs: dict[str, str]) -> list[list[KernelTrial]]:
    """Each task's candidates not yet measured at every share, in its configurations' order, heaviest task first."""
    from ..kernels.candidates import HANDWRITTEN, configs_of, needs_baseline
    from ..records.baselines import workload_key

    if target.kind.name != "cuda":
        return []
    done = [{(r.workload, r.kind, r.config) for r in kernel_records.read(d)} for d in records_dirs.values()]
    trials = []
    for task in sorted(tasks, key=lambda t: -t.cost_in_model()):
        if task.negligible:
            continue
        func = task.ctx.mod["main"]
        try:
            names = configs_of(func)
        except Exception as exc:  # a task the planners cannot read has no kernel of another kind
            log.info("no kernel of another kind for %s: %s", task.name, exc)
            continue
        if names and needs_baseline(func):
            names = [HANDWRITTEN, *names]
        key = workload_key(task.ctx.mod)
        trials.append([KernelTrial(task, key, name, func) for name in names
                       if not all((key, kind_of(name), name) in d for d in done)])
    return trials


def try_kernels(tasks: list, *, target, builder, run, results_by_share, reference_of, records_dirs: dict[str, str],
                out_of_time, on_progress=None) -> dict[str, dict[int, KernelRecord]]:
    """Build, check and time the Triton candidates of `tasks` not measured yet, and record them at each share.
    `reference_of(task)`: the task's own kernel, scheduled, that a candidate is checked against.
    `on_progress(done, total)`: after each candidate's outcome (the progress bar's status line).
    `run(task, runner_inputs)`: the runner's futures at the shares that want the task; `results_by_share(future)`:
    {share label: RunnerResult}. Returns {share label: {task index: its fastest kernel whose output was right}},
    from this call's records and earlier ones."""
    from ..kernels.candidates import build_candidate
    from . import callbacks
    from .session_runner import is_not_measured

    trials = plan_trials(tasks, target=target, records_dirs=records_dirs) if available(target) else []
    if trials:
        log.info("trying %d Triton kernels for %d tasks", len(trials), len({id(t.task) for t in trials}))
    references: dict[int, object] = {}
    builds = []
    for trial in trials:
        if out_of_time():
            break
        index = trial.task.index
        if index not in references:
            references[index] = reference_of(trial.task)
        builds.append((trial, builder.submit_call(build_candidate, trial.func, references[index], trial.config,
                                                  target)))
    if builds and on_progress is not None:
        on_progress(0, len(builds))

    def record(done: int, trial: KernelTrial, future) -> None:
        results = {label: None for label in records_dirs} if future is None else results_by_share(future)
        for label, result in results.items():
            if result is not None and is_not_measured(result):
                continue  # never ran (the runner stopped): not a trial
            error = trial.error if result is None else (str(result.error_msg) if result.error_msg else None)
            kernel_records.append(records_dirs[label], KernelRecord(
                workload=trial.workload, kind=kind_of(trial.config), config=trial.config,
                run_secs=tuple(float(s) for s in result.run_secs) if result is not None and not error else (),
                checked=error is None, target=f"{target.kind.name} {target.attrs.get('arch', '')}".strip(),
                error=error_line(error) if error else ""))
        if trial.path:
            callbacks.remove_artifact(trial.path)
        if on_progress is not None:
            on_progress(done, len(builds))

    measuring = measure_in_order(builds, device_type="cuda", run=run, out_of_time=out_of_time, on_result=record)
    for trial, future in builds[measuring:]:  # the time budget ran out: neither measured nor recorded
        if future.done() and future.exception() is None:
            callbacks.remove_artifact(future.result())
        future.cancel()
    keys = {_key(task): task.index for task in tasks}
    return {label: {keys[key]: record for key, record in kernel_records.best_checked(directory).items()
                    if key in keys}
            for label, directory in records_dirs.items()}


# Runs sent ahead of the one waited on: the next library loads while one is timed, and a time budget that runs out
# leaves no queue of measurements behind it (all sent at once, GPT-2's overran 90 s by 127: benchmarks/RESULTS.md)
AHEAD = 1


def measure_in_order(builds: list, *, device_type: str, run, out_of_time, on_result) -> int:
    """Measure each (trial, build future) of `builds` in order once it is built: `run(trial.task, [RunnerInput])` sends
    it, and `on_result(done, trial, runner future, or None where the build failed)` takes its outcome; a run is sent
    only while at most AHEAD others are untaken. Stops sending when `out_of_time()`. Returns how many builds were
    sent or failed (the rest are the caller's to drop)."""
    import collections

    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    in_flight: collections.deque = collections.deque()
    taken = done = 0
    for trial, future in builds:
        while len(in_flight) > AHEAD:
            done += 1
            on_result(done, *in_flight.popleft())
        if out_of_time():
            break
        taken += 1
        try:
            trial.path = future.result()
        except Exception as exc:  # the worker's exception, a timeout or its death: this configuration fails here
            trial.error = f"build: {type(exc).__name__}: {error_line(str(exc))}"
            in_flight.append((trial, None))
            continue
        in_flight.append((trial, run(trial.task, [RunnerInput(trial.path, device_type,
                                                               ArgInfo.from_prim_func(trial.func))])[0]))
    while in_flight:
        done += 1
        on_result(done, *in_flight.popleft())
    return taken


def _key(task) -> str:
    from ..records.baselines import workload_key

    return workload_key(task.ctx.mod)
