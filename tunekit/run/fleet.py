"""A fleet: several models, each at its share, tuned by one search with one trial budget (`tunekit tune
a.onnx b.onnx --cpu-pct 50`, `tunekit tune fleet.yaml`, api.tune_fleet).

  per model: load, prepare, its own records dir's identity          (run.pipeline, as a single run does; each
    model prepared in a process of its own at once, run.prepare_apart), its untuned build started on a thread
  the fleet's shares: sessions; the tasks planned (below) and the runner fleets, build workers or Ray clients
    started once for every model, beside the untuned builds (planned and started again when a model fails there
    or falls back to fp32)
  per model: the untuned model (built since it was prepared) measured at its share
  one search over every model's tasks, each workload once, weighted by the model's weight x the workload's
    count in it: the scheduler's gradient rule then lowers the weighted sum of the models' latencies (Ansor's
    multi-DNN objective). In one process a candidate is measured at the shares of the models that have its
    workload; through Ray, each share's tasks (its models') are sharded over its tuning clients. Records go to
    <out>/records-<share>.
  per model: the records of its workloads copied into its own records dir, compiled (all at once), then
    measured and reported
A model that fails (to load, to prepare, at its untuned or tuned build) never stops the others: its row in
<out>/report.json says why.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import hashlib
import logging
import math
import os
import time

from ..config import FleetModel, TuneConfig
from ..errors import RunFailed, TunekitError, one_line
from ..results import FleetResult, TuneResult
from ..shares.share import Share
from .executor import ShareJob
from .pipeline import Pipeline
from .report import write_report
from .session import check_out_dir
from .steps import StepTimes

log = logging.getLogger("tunekit")

WEIGHT_STEPS = 10  # a task's weight is an integer in MetaSchedule: model weights are kept to a tenth of the smallest


@dataclasses.dataclass
class _Member:
    """One model of the fleet and how far it got."""

    name: str
    entry: FleetModel
    share: Share
    pipeline: Pipeline
    loaded: object = None
    job: ShareJob | None = None
    keys: dict = dataclasses.field(default_factory=dict)  # workload key -> (its task name, its weight here)
    fused_keys: set = dataclasses.field(default_factory=set)  # its fused attentions' workload keys
    untuned_build: concurrent.futures.Future | None = None  # started once the member is prepared
    untuned: object = None
    result: TuneResult | None = None
    error: str | None = None

    def fail(self, step: str, exc: BaseException) -> None:
        text = one_line(str(exc)) if isinstance(exc, TunekitError) else f"{type(exc).__name__}: {one_line(str(exc))}"
        self.error = f"{step}: {text[:300]}"
        log.warning("fleet: %s failed at %s; the others go on", self.name, self.error)


def member_names(models: list[FleetModel]) -> list[str]:
    """Each model's name (its out dir under the fleet's): given, else the file's stem; repeats get -2, -3."""
    names, seen = [], {}
    for entry in models:
        base = entry.name or os.path.splitext(os.path.basename(entry.model))[0]
        seen[base] = seen.get(base, 0) + 1
        names.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    if len(set(names)) != len(names):
        raise TunekitError(f"fleet model names repeat: {names}; give each a `name:`")
    return names


def with_objective(config: TuneConfig, *, one_process: bool) -> TuneConfig:
    """`config` with fleet_objective auto resolved, before the executor and the models' pipelines take it: the
    geometric mean where the fleet's search is one process of the tunekit engine, else the sum (the only objective
    that splits over the Ray clients' shards)."""
    one_search = one_process and config.engine == "tunekit"
    if config.fleet_objective == "geomean" and not one_search:
        raise TunekitError("fleet_objective 'geomean' needs the fleet's search in one process of the tunekit engine "
                           "(leave out --clients and --engine stock)")
    if config.fleet_objective != "auto":
        return config
    return dataclasses.replace(config, fleet_objective="geomean" if one_search else "sum")


def tune_fleet(models: list[FleetModel], shares: list[Share], *, out: str, config: TuneConfig, executor,
               show_progress: bool = False) -> FleetResult:
    """`shares[i]` is `models[i]`'s share (api.tune_fleet resolves them). The executor groups the fleet's shares
    (one process: one group, every candidate measured at every share; Ray: the shares that fit on a device
    together, each searched by its own clients); each group's models are tuned at once."""
    from ..records.identity import out_dir_lock

    if len({share.kind for share in shares}) > 1:
        raise TunekitError("a fleet's models are all at GPU shares or all at CPU shares")
    started = time.time()
    check_out_dir(out)
    members = [_Member(name, entry, share, Pipeline(model=entry.model, shares=[share], out=os.path.join(out, name),
                                                    config=config, executor=executor))
               for name, entry, share in zip(member_names(models), models, shares)]
    outcomes: dict = {}
    steps = StepTimes()
    with contextlib.ExitStack() as stack:
        stack.enter_context(out_dir_lock(out))
        stack.enter_context(executor.connect())
        builds = stack.enter_context(_threads(len(members), "untuned"))
        with steps("prepare_s"):
            _prepare_all(members, out, config, builds)
        live = [m for m in members if not m.error]
        if not live:
            raise RunFailed("no model of the fleet could be prepared: " + "; ".join(f"{m.name}: {m.error}" for m in members))
        jobs = _share_jobs(live, out, config)
        for job in jobs:
            executor.recover(job)
        for group in executor.groups(jobs):
            labels = {job.label for job in group}
            outcomes.update(_tune(group, [m for m in live if m.job.label in labels], executor, show_progress,
                                  steps))
    report = fleet_report(members, outcomes, jobs, started=started, config=config)
    report["command_s"] = steps.times  # where the fleet's wall went, summed over its groups
    return FleetResult(out_dir=out, report_path=write_report(report, out),
                       results={m.name: m.result for m in members if m.result is not None},
                       failed={m.name: m.error for m in members if m.error}, report=report)


def _prepare_all(members: list[_Member], out: str, config: TuneConfig, builds) -> None:
    """Every model loaded here, one at a time, while each is prepared in a process of its own (run.prepare_apart),
    then their prepared modules taken; each model's untuned build starts on `builds` as soon as it is taken."""
    from .prepare_apart import PreparedApart

    apart = PreparedApart(os.path.join(out, "work"))
    try:
        for member in members if len(members) > 1 else []:
            try:
                for target, precision in member.pipeline.preparations():
                    apart.start(name=member.name, model=member.entry.model, input_shapes=config.input_shapes,
                                target=target, precision=precision)
            except Exception as exc:  # prepared here instead, where a fault says what it is in the member's row
                log.debug("fleet: %s is prepared in this process (%s)", member.name, exc)
                continue
            member.pipeline.prepared_ahead = apart.taker(member.name)
        for member in members:
            _step(member, lambda: setattr(member, "loaded", member.pipeline.load_model()))
        for member in members:
            if not member.error and _step(member, lambda: _prepare(member)):
                member.untuned_build = member.pipeline.build_untuned_ahead(member.job, pool=builds)
    finally:
        apart.close()


def _prepare(member: _Member) -> None:
    member.job = member.pipeline.prepare(member.loaded)[0]
    member.pipeline.check_identity(member.job, member.loaded)


def _step(member: _Member, step) -> bool:
    """Whether `step()` went through; where it did not, the member fails (the others are tuned)."""
    try:
        step()
        return True
    except Exception as exc:
        member.fail("prepare", exc)
        return False


def _share_jobs(live: list[_Member], out: str, config: TuneConfig) -> list[ShareJob]:
    """One job per share of the fleet, its database <out>/records-<share> holding its models' workloads (its
    tasks are filled in once the models' untuned builds have settled their precision)."""
    from ..records.database import count_trials, database_dir
    from ..records.identity import check_or_write, run_identity
    from .session import device_name

    jobs: dict[str, ShareJob] = {}
    names = hashlib.sha256("\n".join(sorted(m.name for m in live)).encode()).hexdigest()
    for member in sorted(live, key=lambda m: -m.share.pct):
        label = member.job.label
        if label not in jobs:
            job = ShareJob(member.share, member.job.target, None, [], database_dir(out, label), out, precision="fleet")
            check_or_write(job.db_dir, run_identity(model_sha256=f"fleet:{names}", share_label=label, target=job.target,
                                                    device=device_name(job.share), input_shapes={}, precision="fleet"),
                           resume=config.resume, existing_trials=count_trials(job.db_dir))
            jobs[label] = job
    return list(jobs.values())


def _tune(group: list[ShareJob], members: list[_Member], executor, show_progress: bool, steps: StepTimes) -> dict:
    """One group of the fleet's shares: its models' untuned builds timed, then one tuning of their tasks, then
    each model's artifact. {share label: TuningOutcome}."""
    from ..clients.progress import ProgressBar

    with contextlib.ExitStack() as stack:
        with steps("sessions_s"):
            sessions = stack.enter_context(executor.group_sessions(group))
            for session in sessions.values():
                session.latency_process()  # started now: its start overlaps the untuned builds
        with steps("tasks_s"):
            planned = _plan(group, members, executor)
        # the fleets, build workers and clients start beside the untuned builds (Ray plans its shards from the tasks)
        warm_up = stack.enter_context(contextlib.ExitStack())
        warm = warm_up.enter_context(executor.warm_up(group, sessions))
        # the untuned builds (started as each model was prepared), timed one after another
        with steps("untuned_s"):
            for member in members:
                label = member.job.label
                concurrent.futures.wait([member.untuned_build])
                try:
                    member.untuned = member.pipeline.measure_untuned([member.job], {label: sessions[label]},
                                                                     member.loaded, settle=warm.settle)[label]
                except Exception as exc:
                    member.fail("untuned", exc)
        tuned = [m for m in members if not m.error]
        if not tuned:
            log.warning("fleet: no model at %s has an untuned build", ", ".join(job.label for job in group))
            return {}
        if _plan_key(tuned) != planned:  # a model failed or fell back to fp32: the tasks changed, and the warm-up
            with steps("warm_up_s"):
                warm_up.close()
                _plan(group, tuned, executor)
                stack.enter_context(executor.warm_up(group, sessions))
        config = executor.config
        progress = ProgressBar(total=executor.progress_total(group), show=show_progress,
                               seconds=None if config.trials_bounded else config.time_budget_s)
        try:
            with steps("tune_s"):
                outcomes = executor.tune(group, sessions, progress)
        finally:
            progress.close()
        jobs = {job.label: job for job in group}
        # every artifact built at once, then each timed and reported
        with steps("finish_s"), _threads(len(tuned), "tuned") as pool:
            own = {m.name: _build_ahead(m, jobs[m.job.label], outcomes[m.job.label], tuned, pool) for m in tuned}
            for member in tuned:
                if own[member.name] is not None:
                    _finish(member, own[member.name], sessions[member.job.label])
        return outcomes


def _plan(group: list[ShareJob], members: list[_Member], executor) -> list:
    """Each job's tasks: its members' workloads merged (every member's, when one search measures every share); with
    several shares, which shares each workload is measured at. Returns the plan's key (_plan_key)."""
    every_share = executor.measures_every_share(group)
    for job in group:
        job.tasks = merge_tasks([m for m in members if every_share or m.job.label == job.label], target=job.target)
        job.fused_tasks = merge_fused([m for m in members if every_share or m.job.label == job.label])
    for job in group:
        job.task_models = task_models(job.tasks, [m for m in members if every_share or m.job.label == job.label])
    if every_share and len(group) > 1:  # a workload is measured at the shares of the models that have it
        wanted = task_shares(group[0].tasks, members)
        for job in group:
            job.task_shares = wanted
    return _plan_key(members)


def _plan_key(members: list[_Member]) -> list:
    """What the plan depends on: the models in it and the precision each is tuned in."""
    return [(m.name, m.job.precision) for m in members]


def _threads(count: int, name: str) -> concurrent.futures.ThreadPoolExecutor:
    return concurrent.futures.ThreadPoolExecutor(max(1, min(count, os.cpu_count() or 1)),
                                                 thread_name_prefix=f"tunekit-fleet-{name}")


def merge_tasks(members: list[_Member], *, target) -> list:
    """Every workload of the members' tasks once, weighted by sum(model weight x its count in the model),
    scaled so that the smallest model weight counts WEIGHT_STEPS. Fills each member's `keys`."""
    from tvm.s_tir import meta_schedule as ms

    from ..records.baselines import workload_key

    if not members:
        return []
    smallest = min(m.entry.weight for m in members)
    merged: dict[str, list] = {}  # key -> [task, weight]
    for member in members:
        member.keys = {}
        for task in member.job.tasks:
            key = workload_key(task.dispatched[0])
            member.keys[key] = (task.task_name, int(task.weight))
            merged.setdefault(key, [task, 0.0])[1] += task.weight * member.entry.weight / smallest
    names: set[str] = set()
    tasks = []
    for key, (task, weight) in merged.items():
        name = task.task_name if task.task_name not in names else f"{task.task_name}_{key[:6]}"
        names.add(name)
        tasks.append(ms.ExtractedTask(name, task.mod, target, list(task.dispatched),
                                      max(1, round(weight * WEIGHT_STEPS))))
    return tasks


def merge_fused(members: list[_Member]) -> list:
    """Every fused attention of the members once (their kernels of another kind are tried once); fills each member's
    `fused_keys`, whose kernel records it is handed."""
    from ..kernels.in_module import task_key

    merged = {}
    for member in members:
        member.fused_keys = set()
        for task in member.job.fused_tasks:
            key = task_key(task.dispatched[0]["main"])
            member.fused_keys.add(key)
            merged.setdefault(key, task)
    return list(merged.values())


def task_models(tasks: list, members: list[_Member]) -> dict[str, dict[str, float]]:
    """{merged task name: {member name: its weight x the workload's count in it}} (members' `keys` filled)."""
    from ..records.baselines import workload_key

    return {task.task_name: {m.name: m.entry.weight * m.keys[key][1] for m in members if key in m.keys}
            for task in tasks for key in [workload_key(task.dispatched[0])]}


def task_shares(tasks: list, members: list[_Member]) -> dict[str, set[str]]:
    """{merged task name: the share labels of the members that have its workload} (members' `keys` filled)."""
    from ..records.baselines import workload_key

    return {task.task_name: {m.job.label for m in members if workload_key(task.dispatched[0]) in m.keys}
            for task in tasks}


def _build_ahead(member: _Member, job: ShareJob, outcome, members: list[_Member], pool):
    """The member's records (its workloads' of the fleet's database) in its own records dir, and its tuned build
    started on `pool`. Its own outcome (model_outcome), or None when that failed."""
    from ..records.subset import write_subset

    try:
        write_subset(job.db_dir, member.job.db_dir, set(member.keys) | member.fused_keys)
        own = model_outcome(outcome, member, members, job)
        member.pipeline.build_tuned_ahead(member.job, member.loaded, own, pool=pool)
        return own
    except Exception as exc:
        member.fail("tuned build", exc)
        return None


def _finish(member: _Member, outcome, session) -> None:
    """The member's artifact (built ahead) measured and reported as a single run's."""
    try:
        member.result = member.pipeline.finish(member.job, member.loaded, outcome, session, member.untuned)
    except Exception as exc:
        member.fail("tuned build", exc)


def model_outcome(outcome, member: _Member, members: list[_Member], job: ShareJob):
    """The fleet's TuningOutcome as the member's own: its tasks' rows, under its own task names and weights,
    each saying which models share it (`fleet_models`); its trials are its tasks' trials."""
    rows = []
    for row in outcome.tasks:
        key = row.get("workload_hash")
        if key in member.keys:
            name, weight = member.keys[key]
            rows.append({**row, "name": name, "weight": weight, "fleet_task": row["name"],
                         "fleet_models": [m.name for m in members if key in m.keys]})
    return dataclasses.replace(
        outcome, tasks=rows, trials_done=sum(r.get("trials", 0) for r in rows),
        trials_failed=sum(r.get("failed", 0) for r in rows), trials_cached=sum(r.get("cached", 0) for r in rows),
        phases=dict(outcome.phases),
        extra={**outcome.extra, "fleet": {"out_dir": job.out, "records_dir": job.db_dir, "trials": outcome.trials_done}})


def fleet_report(members: list[_Member], outcomes: dict, jobs: list[ShareJob], *, started: float,
                 config: TuneConfig) -> dict:
    """<out>/report.json: every model's row (or why it failed), the weighted sums of their latencies, and what
    the one search did."""
    rows = []
    for m in members:
        row = {"name": m.name, "model": os.path.abspath(m.entry.model), "share": m.share.label,
               "weight": m.entry.weight, "out_dir": m.pipeline.out}
        if m.result is not None:
            shared = sum(1 for t in m.result.report.get("tasks", []) if len(t.get("fleet_models", [])) > 1)
            row.update(untuned_ms=m.result.untuned_ms, tuned_ms=m.result.tuned_ms,
                       speedup=round(m.result.speedup, 3), tasks=len(m.keys), tasks_shared=shared,
                       trials=m.result.trials, fallback_tasks=m.result.report.get("fallback_tasks", 0),
                       report=m.result.report_path, artifact=m.result.artifact)
        else:
            row["error"] = m.error
        rows.append(row)
    done = [r for r in rows if "tuned_ms" in r]
    weights = sum(r["weight"] for r in done) or 1.0

    def geomean(column: str) -> float:
        return round(math.exp(sum(r["weight"] * math.log(r[column]) for r in done) / weights), 4) if done else 0.0
    keys = {key for m in members for key in m.keys}
    in_many = {key for key in keys if sum(1 for m in members if key in m.keys) > 1}
    return {
        "fleet": rows, "models": len(rows), "models_tuned": len(done), "models_failed": len(rows) - len(done),
        "objective": config.fleet_objective,  # what the search lowered: the weighted sum or geometric mean
        "weighted_latency_ms": {"untuned": round(sum(r["weight"] * r["untuned_ms"] for r in done), 4),
                                "tuned": round(sum(r["weight"] * r["tuned_ms"] for r in done), 4)},
        "weighted_geomean_ms": {"untuned": geomean("untuned_ms"), "tuned": geomean("tuned_ms")},
        "tasks": {"in_models": sum(len(m.keys) for m in members), "searched": len(keys), "shared": len(in_many),
                  "per_share": {job.label: len(job.tasks) for job in jobs}},
        "trials": {"requested": config.trials if config.trials_bounded else None,
                   "measured": {label: outcome.trials_done for label, outcome in outcomes.items()}},
        "shares": [job.label for job in jobs], "records_dirs": {job.label: job.db_dir for job in jobs},
        "tuning_wall_s": {label: round(outcome.wall_s, 2) for label, outcome in outcomes.items()},
        "wall_s": round(time.time() - started, 2),
    }
