"""The tuning pipeline: everything around tuning, done once for every executor.

  load model ─> check out dir ─> per share: target, precision, prepared module, tasks, database dir
  lock out dir, executor.connect()
    per share: identity check (--resume never mixes runs), executor.recover()
    per group of shares tuned together (executor.groups):
      untuned model compiled, measured at the share, its numerics checked (before any tuning)
      executor.tune(group)                       <- the only part that differs between executors
      per share: baselines, records worth applying, compile, tuned latency and numerics, report
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import math
import os
import shutil
import time
from dataclasses import dataclass
from typing import Callable

from ..config import TuneConfig
from ..errors import RunFailed, error_line
from ..kernels.candidates import HANDWRITTEN, other_kind
from ..results import TuneResult
from ..servers.latency import LatencyFailed
from ..shares.share import Share
from .. import numerics
from .executor import ShareJob
from .report import tune_report, write_report
from .session import LoadedModel, ShareSession, check_out_dir, device_name, load_model
from .steps import StepTimes
from .untuned_builds import UntunedBuilds

log = logging.getLogger("tunekit")


REPAIR_MIN_S = 300.0  # the least time the search for broken records gets before the rest is left out unsearched
TUNED_TIMING_MIN_S = 120.0  # the least a tuned build's load and timing are given (CUDA module load, graph capture)


class TunedBuildFailed(RunFailed):
    """A build with tuned records failed to compile (a record that does not build)."""


@dataclass
class Measured:
    """A compiled model measured at a share: its latency, and its outputs against the reference."""

    path: str
    latency: dict
    numerics: list


class Pipeline:
    def __init__(self, *, model, shares: list[Share], out: str, config: TuneConfig, executor,
                 show_progress: bool = False, share_choice: dict | None = None, example_inputs=None):
        """`model`: an ONNX path, or a torch.nn.Module with its `example_inputs`."""
        self.model, self.shares, self.out, self.config = model, shares, out, config
        self.example_inputs = example_inputs
        self.executor = executor
        self.show_progress = show_progress
        self.share_choice = share_choice
        self.started = time.time()
        self._step = StepTimes()
        self.robust: dict | None = None  # --robust: the share-robust artifact and its regret matrix
        self._untuned_builds = UntunedBuilds()  # by (prepared module, target, graphs)
        self.precision_fallbacks: dict[str, str] = {}  # share -> why --precision auto fell back to fp32
        self._timing_limit_s: dict[str, float] = {}  # share -> how long a timing may take, from the untuned one's
        self._ahead: dict[str, tuple] = {}  # share -> (records, {path: its build's future}) from build_tuned_ahead
        self._kernels_off: dict[str, str] = {}  # share -> why its kernels of another kind were left out of its build
        # (target, precision) -> (prepared module, precision) or None: a preparation made elsewhere (a fleet's)
        self.prepared_ahead: Callable | None = None

    # ---------------------------------------------------------------- before tuning
    def _jobs(self, loaded: LoadedModel) -> list[ShareJob]:
        from ..frontend.precision import prepare
        from ..frontend.tasks import extract_tasks

        prepared_for: dict[tuple, tuple] = {}
        jobs = []
        for share, target, db_dir, wanted in self._share_plans():
            key = (str(target.export()), wanted)
            if key not in prepared_for:  # tasks depend only on the target (CPU: its core count), not the share
                ahead = self.prepared_ahead(target, wanted) if self.prepared_ahead else None
                prepared, precision = ahead or prepare(loaded.mod, target, precision=wanted)
                prepared_for[key] = (prepared, extract_tasks(prepared, target), precision)
            prepared, tasks, precision = prepared_for[key]
            jobs.append(ShareJob(share, target, prepared, _unscheduled(tasks), db_dir, self.out, precision=precision,
                                 fused_tasks=_scheduled(tasks)))
            log.info("%s: %d tuning tasks in %s, %d trials at %s", loaded.name, len(jobs[-1].tasks), precision,
                     self.config.trials, share.label)
        return jobs

    def _share_plans(self) -> list[tuple]:
        """(share, its target, its records dir, the precision to prepare it in) for every share."""
        from ..records.database import database_dir
        from ..targets import target_for

        plans = []
        for share in self.shares:
            db_dir = database_dir(self.out, share.label)
            plans.append((share, target_for(share), db_dir, self._precision_for(db_dir)))
        return plans

    def preparations(self) -> list[tuple]:
        """(target, precision) of each module _jobs prepares, for a preparation made elsewhere ahead of it."""
        wanted = {}
        for _, target, _, precision in self._share_plans():
            wanted.setdefault((str(target.export()), precision), (target, precision))
        return list(wanted.values())

    def check_identity(self, job: ShareJob, loaded: LoadedModel, *, resume: bool | None = None) -> None:
        from ..records.database import count_trials
        from ..records.identity import check_or_write, run_identity, write_bound_overrides

        identity = run_identity(model_sha256=loaded.digest, share_label=job.label, target=job.target,
                                device=device_name(job.share), input_shapes=loaded.inputs.shapes,
                                precision=job.precision)
        check_or_write(job.db_dir, identity, resume=self.config.resume if resume is None else resume,
                       existing_trials=count_trials(job.db_dir))
        write_bound_overrides(job.db_dir, self._bound_overrides())

    def _measure(self, job: ShareJob, session: ShareSession, *, path: str, database, cuda_graph=None,
                 what: str, settle=None, compiled: bool = False, built=None) -> Measured:
        """Compile (with `database`'s records; `compiled`: `path` is that build already; `built`: the future of
        that build, started ahead), time at the share, compare outputs to the reference, and refuse in one line an
        artifact past its precision's bound. `settle(job)`: waits, after the compile, until the share is quiet
        enough to time on (the executor's warm-up)."""
        ahead = built is not None and built.exception() is None
        if not compiled and not ahead:  # a build ahead that failed is tried once more here, alone
            self._compile(job, path=path, database=database, cuda_graph=cuda_graph)
        if settle is not None:
            settle(job)
        started = time.perf_counter()
        latency, outputs = session.measure_latency(artifact=path, inputs=self.sample,
                                                   repeats=self.config.measure_repeats,
                                                   timeout_s=self._timing_limit_s.get(job.label, 600.0))
        if database is None:  # a tuned build that hangs (a kernel that never ends) is given up on well before 600 s
            self._timing_limit_s[job.label] = max(TUNED_TIMING_MIN_S, 10 * (time.perf_counter() - started))
        rows = numerics.compare_outputs(self.output_names, outputs, self.reference)
        numerics.check(rows, precision=job.precision, what=what, bound=self._bound(job))
        return Measured(path, latency, rows)

    def _measure_untuned_at(self, job: ShareJob, session: ShareSession, loaded: LoadedModel, *,
                         settle=None) -> Measured:
        """The untuned model at the share, before any tuning. With --precision auto, an fp16 build that
        the numerics gate refuses (values outside fp16's range: MobileNetV2 with random weights has
        logits of about 1e-9, which fp16 flushes to zero) is prepared again in fp32, and the share is
        tuned in fp32; the report says why (`precision_fallback`)."""
        try:
            return self._measure(job, session, path=self._untuned_path(job), database=None,
                                 what=f"the untuned {job.precision} model", settle=settle)
        except numerics.NumericsRefused as refusal:
            from ..records.database import count_trials

            # fp16 records already measured for this share stay fp16: no silent switch under them
            if self.config.precision != "auto" or job.precision == "fp32" or count_trials(job.db_dir):
                raise
            log.warning("precision auto: %s; tuning %s in fp32 instead", refusal, job.label)
            self._prepare_fp32(job, loaded)
            self.precision_fallbacks[job.label] = str(refusal)
            return self._measure(job, session, path=self._untuned_path(job), database=None,
                                 what="the untuned fp32 model")

    def measure_untuned(self, group: list[ShareJob], sessions: dict, loaded: LoadedModel, *,
                               settle=None) -> dict[str, Measured]:
        """Every share's untuned model, in one precision for the whole group. The group's shares are
        tuned together (one search measures each candidate at every share), so when `auto` falls back
        to fp32 at one share, the others follow with the same fp32 module, also those measured before
        it: a share left in fp16 would tune tasks the search never proposes, and its fp16 model could
        be refused after all its tuning."""
        from ..clients import task_faults

        task_faults.raise_if_injected("untuned_model", loaded.name)
        untuned: dict[str, Measured] = {}
        fallen: ShareJob | None = None
        for job in group:
            if fallen is None:  # once one share fell back, the rest follow it below, unmeasured in fp16
                untuned[job.label] = self._measure_untuned_at(job, sessions[job.label], loaded, settle=settle)
                fallen = job if job.label in self.precision_fallbacks else None
        for job in group:  # every other share of the group, also those measured in fp16 before it fell back
            if fallen is not None and self._follows_fallback(job):
                self._adopt_fp32(job, fallen, loaded)
                untuned[job.label] = self._measure(job, sessions[job.label], path=self._untuned_path(job),
                                                   database=None, what="the untuned fp32 model", settle=settle)
            elif job.label not in untuned:  # one that cannot follow (its fp16 records are kept): as it is
                untuned[job.label] = self._measure_untuned_at(job, sessions[job.label], loaded, settle=settle)
        return untuned

    def _follows_fallback(self, job: ShareJob) -> bool:
        from ..records.database import count_trials

        return self.config.precision == "auto" and job.precision != "fp32" and not count_trials(job.db_dir)

    def _adopt_fp32(self, job: ShareJob, fallen: ShareJob, loaded: LoadedModel) -> None:
        """`job` takes `fallen`'s fp32 module and tasks (prepared once for the group)."""
        log.warning("precision auto: %s fell back to fp32; tuning %s in fp32 too", fallen.label, job.label)
        job.prepared, job.precision, job.tasks = fallen.prepared, fallen.precision, list(fallen.tasks)
        job.fused_tasks = list(fallen.fused_tasks)
        self.precision_fallbacks[job.label] = f"{self.precision_fallbacks[fallen.label]} (at {fallen.label})"
        self.check_identity(job, loaded, resume=False)

    def _prepare_fp32(self, job: ShareJob, loaded: LoadedModel) -> None:
        """`job` with its module, tasks and precision replaced by the fp32 ones (its identity too: the
        share's records are fp32 records from now on, and a --resume keeps them fp32: _precision_for)."""
        from ..frontend.precision import prepare
        from ..frontend.tasks import extract_tasks

        job.prepared, job.precision = prepare(loaded.mod, job.target, precision="fp32")
        tasks = extract_tasks(job.prepared, job.target)
        job.tasks, job.fused_tasks = _unscheduled(tasks), _scheduled(tasks)
        self.check_identity(job, loaded, resume=False)  # no trials yet: the identity is rewritten as fp32

    def _precision_for(self, db_dir: str) -> str:
        """The precision to prepare a share in: the configured one, except that `auto` keeps an earlier
        run's fp32 fallback for the records it resumes (they were measured in fp32)."""
        from ..records.database import count_trials
        from ..records.identity import read_identity

        if self.config.precision == "auto" and self.config.resume and count_trials(db_dir):
            if (read_identity(db_dir) or {}).get("precision") == "fp32":
                return "fp32"
        return self.config.precision

    def _compile(self, job: ShareJob, *, path: str, database, cuda_graph) -> None:
        """Compile `job.prepared` with `database`'s records. Without records the build depends only on
        the prepared module and the target, so shares that share both (a GPU's shares) compile it once."""
        from ..clients.compiler import compile_and_export, kernels_worth_applying

        key = (id(job.prepared), str(job.target.export()), cuda_graph)
        kernels = kernels_worth_applying(job.db_dir, database) \
            if database is not None and job.label not in self._kernels_off else None

        def write(kernels=kernels) -> None:
            compile_and_export(prepared_mod=job.prepared, target=job.target, database=database, path=path,
                               cuda_graph=cuda_graph, kernels=kernels)

        def write_without_failing_kernels() -> None:
            try:
                write()
            except Exception as exc:  # a kernel of another kind must not cost the run its tuned build
                if not kernels:
                    raise
                self._leave_kernels_out(job, f"the build with them failed: {error_line(str(exc))}")
                write(kernels=None)

        try:
            self._untuned_builds.build(path, write_without_failing_kernels, key=key if database is None else None)
        except Exception as exc:  # a record that does not build: numerics_repair leaves its task untuned
            if database is None:
                raise
            text = str(exc).strip()
            raise TunedBuildFailed(f"the tuned build failed: {type(exc).__name__}: "
                                   f"{text.splitlines()[-1][:300] if text else ''}") from exc

    def _leave_kernels_out(self, job: ShareJob, why: str) -> None:
        """`job`'s builds from now on use MetaSchedule's kernels only; report rows say why (_kernel_rows)."""
        if job.label not in self._kernels_off:
            log.warning("%s: the Triton kernels measured best are left out, their tasks take MetaSchedule's: %s",
                        job.label, why)
        self._kernels_off.setdefault(job.label, why)

    def _kernel_rows(self, job: ShareJob, tasks: list[dict]) -> None:
        """Rows whose kernel of another kind was left out of the build take the kind the build has, and say why."""
        why = self._kernels_off.get(job.label)
        for row in tasks if why else []:
            if other_kind(row.get("kernel")):
                row["kernel_left_out"] = why
                row["kernel"] = HANDWRITTEN if "handwritten_us" in row else \
                    "metaschedule" if row.get("record_applied") else "default"

    def _bound(self, job: ShareJob) -> numerics.Bound:
        return numerics.bound_for(job.precision, **self._bound_overrides())

    def _bound_overrides(self) -> dict:
        return {"max_output_error": self.config.max_output_error, "min_output_cosine": self.config.min_output_cosine}

    # ---------------------------------------------------------------- the run
    def load(self):
        """(the loaded model, a job per share with its prepared module and tasks)."""
        loaded = self.load_model()
        return loaded, self.prepare(loaded)

    def load_model(self) -> LoadedModel:
        """The model imported, its sample inputs and their reference outputs."""
        from ..records.database import find_share_databases

        with self._step("load_s"):
            loaded = load_model(self.model, self.config.input_shapes, example_inputs=self.example_inputs)
            check_out_dir(self.out)
            for source in self.config.warm_start:  # a typo fails now, not after the untuned build
                find_share_databases(source)
            self.sample = loaded.inputs.random(seed=self.config.seed)
            self.reference = loaded.reference(self.sample)
            self.output_names = loaded.output_names
        return loaded

    def prepare(self, loaded: LoadedModel) -> list[ShareJob]:
        with self._step("prepare_s"):
            return self._jobs(loaded)

    def run(self) -> list[TuneResult]:
        from ..records.identity import out_dir_lock

        loaded, jobs = self.load()
        results = []
        with contextlib.ExitStack() as stack:
            stack.enter_context(out_dir_lock(self.out))
            with self._step("connect_s"):
                stack.enter_context(self.executor.connect())
            for job in jobs:
                self.check_identity(job, loaded)  # checked before any work: records never appended by accident
                self.executor.recover(job)
            for group in self.executor.groups(jobs):
                results += self._tune_group(group, loaded)
        order = [s.label for s in self.shares]  # as the user listed them, whatever ran first
        return sorted(results, key=lambda r: order.index(r.share))

    def _tune_group(self, group: list[ShareJob], loaded: LoadedModel) -> list[TuneResult]:
        from ..clients.progress import ProgressBar

        with contextlib.ExitStack() as stack:
            with self._step("session_s"):
                sessions = stack.enter_context(self.executor.group_sessions(group))
                for session in sessions.values():
                    session.latency_process()  # started now: its start overlaps the untuned compile
            # the fleets and build workers start beside the untuned model's compile and timing
            warm = stack.enter_context(self.executor.warm_up(group, sessions))
            with self._step("untuned_s"):
                untuned = self.measure_untuned(group, sessions, loaded, settle=warm.settle)
            progress = ProgressBar(total=self.executor.progress_total(group), show=self.show_progress,
                                   seconds=None if self.config.trials_bounded else self.config.time_budget_s)
            try:
                with self._step("tune_s"):
                    outcomes = self.executor.tune(group, sessions, progress)
            finally:
                progress.close()
            results = [self.finish(job, loaded, outcomes[job.label], sessions[job.label], untuned[job.label])
                       for job in group]
            if self.config.robust:
                with self._step("robust_s"):
                    self.robust = self._robust(group, loaded, sessions, results)
            return results

    def _robust(self, group: list[ShareJob], loaded: LoadedModel, sessions: dict, results: list) -> dict:
        """`<model>-robust.so` and its regret matrix (every artifact measured at every share).

        First the static choice: per task the schedule such that the kernels' weighted sum has the
        smallest worst regret over the shares (run.robust), compiled as `<model>-robust-per-task.so`,
        and whichever of it and the shares' own artifacts has the smallest worst regret as a whole
        model. The robust artifact then carries every share's schedules as variants, with the static
        choice as `main`, and runs the variant that is fastest where it is loaded (deploy.variants):
        a static choice alone may not come close to the best at every share (benchmarks/RESULTS.md,
        "share-robust choice")."""
        from ..records.baselines import read_baselines
        from .robust import PER_TASK, pick_robust_artifact, regret_matrix, robust_records

        first = group[0]
        weights = {t["workload_hash"]: t.get("weight", 1) for r in results for t in r.report.get("tasks", [])
                   if t.get("workload_hash")}
        chosen, rows, estimate = robust_records({job.label: job.db_dir for job in group},
                                                {job.label: read_baselines(job.db_dir) for job in group}, weights)
        per_task = os.path.join(self.out, f"{loaded.name}-robust-per-task.so")
        self._measure(first, sessions[first.label], path=per_task, database=chosen, what="the share-robust model")
        self._describe(loaded, first, per_task, share_label=None, trials=0, db_dir=None)
        artifacts = {r.share: r.artifact for r in results}
        artifacts[PER_TASK] = per_task
        latency = {name: {job.label: sessions[job.label].measure_latency(
                              artifact=artifact, inputs=self.sample, repeats=self.config.measure_repeats)[0]["median_ms"]
                          for job in group}
                   for name, artifact in artifacts.items()}
        # The per-task choice minimizes a sum of kernels, each timed alone; the whole model need not follow
        # that sum (benchmarks/RESULTS.md, "share-robust choice"). So the static choice is the one best
        # measured whole.
        static = pick_robust_artifact(latency, [job.label for job in group])
        path = os.path.join(self.out, f"{loaded.name}-robust.so")
        variants = self._compile_variants(group, loaded, path, static=static, per_task_records=chosen)
        measured = {job.label: self._measure_variants(job, sessions[job.label], path) for job in group}
        latency["robust"] = {label: m["median_ms"] for label, m in measured.items()}
        variant_at = {label: m["variant"] for label, m in measured.items()}
        matrix = regret_matrix(latency)
        log.info("robust model: worst regret %.3f over %s, running %s (static choice %s: %s; tuned at %s "
                 "alone: %s)", matrix["robust"]["worst_regret"], ", ".join(j.label for j in group),
                 ", ".join(f"{v} at {s}" for s, v in variant_at.items()), static, matrix[static]["worst_regret"],
                 first.label, matrix[first.label]["worst_regret"])
        return {"artifact": path, "static_choice": static, "variants": variants,
                "variant_at": variant_at, "per_task_artifact": per_task,
                "shares": [job.label for job in group], "tasks": rows, "kernel_sum_estimate": estimate,
                "matrix": matrix}

    def _compile_variants(self, group: list[ShareJob], loaded: LoadedModel, path: str, *, static: str,
                          per_task_records) -> dict:
        """`<model>-robust.so`: every share's records as a variant (`main__<share>`), and `main` the
        static choice. Its metadata lists the variants (deploy.variants), which the latency workers
        and tunekit.load read to time them at load and run the fastest, so it is written first."""
        from ..clients.compiler import compile_variants_and_export, kernels_worth_applying, records_worth_applying
        from ..deploy.variants import entry_name
        from .robust import PER_TASK

        first = group[0]
        sources = {job.label: (job.prepared, records_worth_applying(job.db_dir)[0]) for job in group}
        kernels = {job.label: kernels_worth_applying(job.db_dir, sources[job.label][1]) for job in group
                   if job.label not in self._kernels_off}
        if static == PER_TASK:
            sources[PER_TASK] = (first.prepared, per_task_records)
        with self._step("robust_compile_s"):
            try:
                compile_variants_and_export(variants=sources, default=static, target=first.target, path=path,
                                            kernels=kernels)
            except Exception as exc:  # a kernel of another kind must not cost the run its robust artifact
                if not any(kernels.values()):
                    raise
                for job in group:
                    self._leave_kernels_out(job, f"the robust build with them failed: {error_line(str(exc))}")
                compile_variants_and_export(variants=sources, default=static, target=first.target, path=path)
        variants = {label: entry_name(label) for label in sources}
        self._describe(loaded, first, path, share_label=None, trials=0, db_dir=None,
                       extra={"variants": variants, "default_variant": static})
        return variants

    def _measure_variants(self, job: ShareJob, session: ShareSession, path: str) -> dict:
        """The robust artifact at `job`'s share, running the variant it picks there; its outputs are
        checked as every artifact's are. {median_ms, variant}."""
        latency, outputs = session.measure_latency(artifact=path, inputs=self.sample,
                                                   repeats=self.config.measure_repeats)
        rows = numerics.compare_outputs(self.output_names, outputs, self.reference)
        numerics.check(rows, precision=job.precision, what=f"the share-robust model at {job.label}",
                       bound=self._bound(job))
        return {"median_ms": latency["median_ms"], "variant": latency.get("variant")}

    # ---------------------------------------------------------------- after tuning
    def _untuned_path(self, job: ShareJob) -> str:
        from ..deploy.locate import untuned_artifact_name

        return os.path.join(self.out, untuned_artifact_name(None if len(self.shares) == 1 else job.label))

    def _records_to_apply(self, job: ShareJob, outcome):
        from ..clients.compiler import fused_kernel_rows, kernels_worth_applying, records_worth_applying
        from ..records.baselines import write_baselines

        from ..clients.task_faults import applied_fault

        # an injected wrong or crashing kernel is applied even where it is not faster, so that tests always reach it
        write_baselines(job.db_dir, {t["workload_hash"]: None if applied_fault(t["name"]) else
                                     t.get("untuned_us") for t in outcome.tasks if t.get("workload_hash")})
        records, applied = records_worth_applying(job.db_dir)
        kernels = kernels_worth_applying(job.db_dir, records)
        for row in outcome.tasks:
            if row.get("workload_hash") in applied:
                row["record_applied"] = applied[row["workload_hash"]]
            kernel = kernels.get(row.get("workload_hash"))
            row["kernel"] = kernel.kind if kernel else "metaschedule" if row.get("record_applied") else "default"
        outcome.extra["fused_kernels"] = fused_kernel_rows(job.db_dir, kernels,
                                                           {row.get("workload_hash") for row in outcome.tasks})
        return records

    def _without_broken_records(self, job: ShareJob, session: ShareSession, outcome, records, refused):
        """The tuned build was refused while the untuned one passed: the records that break it are left out
        (numerics_repair), their tasks keep the untuned kernel and the report says why."""
        from ..clients.compiler import records_for
        from .numerics_repair import ProbeBuilds, broken_workloads, mark_fallbacks

        applied = [row["workload_hash"] for row in outcome.tasks if row.get("record_applied")]
        if not applied:
            raise refused
        budget = max(REPAIR_MIN_S, outcome.wall_s)  # at most about as long as the tuning took
        log.warning("%s; looking for the tuned kernels that break it among %d tasks (a build of the model for "
                    "each half tried: about %d builds per broken kernel, for up to %.0f s)", refused, len(applied),
                    2 * max(1, math.ceil(math.log2(len(applied)))), budget)
        probes = ProbeBuilds(lambda keys, path: self._compile(job, path=path, database=records_for(records, keys),
                                                              cuda_graph=None), work_dir=job.work_dir)

        def passes(keys: list[str]) -> bool:
            try:
                path = probes.take(keys)
                self._measure(job, session, path=path, database=records, what="a probe build", compiled=True)
                return True
            except (numerics.NumericsRefused, TunedBuildFailed, LatencyFailed):
                return False
            finally:
                probes.discard(keys)

        deadline = time.monotonic() + budget
        try:
            broken = broken_workloads(applied, passes, time_left=lambda: deadline - time.monotonic(),
                                      prebuild=probes.prebuild)
        finally:
            probes.close()
        mark_fallbacks(outcome.tasks, broken, str(refused).splitlines()[0][:300])
        log.warning("%d task(s) keep their untuned kernel: their tuned kernels broke the model", len(broken))
        return records_for(records, [key for key in applied if key not in broken])

    def _without_kernels(self, job: ShareJob, session: ShareSession, artifact: str, records, outcome, refused):
        """The tuned model refused with kernels of another kind in it: the model without them, measured, or None
        where it had none or is refused too (then the records are looked at, _without_broken_records)."""
        if job.label in self._kernels_off or not any(
                row.get("kernel") not in (None, "metaschedule", "default", HANDWRITTEN)
                for row in outcome.tasks + outcome.extra.get("fused_kernels", [])):
            return None
        self._leave_kernels_out(job, f"the model with them was refused: {str(refused).splitlines()[0][:300]}")
        try:
            return self._measure(job, session, path=artifact, database=records, what="the tuned model")
        except (numerics.NumericsRefused, TunedBuildFailed, LatencyFailed):
            return None

    def build_untuned_ahead(self, job: ShareJob, *, pool) -> concurrent.futures.Future:
        """Compile `job`'s untuned model on `pool` (a fleet builds its models at once); measure_untuned then
        times that build, or where it failed, compiles it again alone."""
        return pool.submit(self._compile, job, path=self._untuned_path(job), database=None, cuda_graph=None)

    def build_tuned_ahead(self, job: ShareJob, loaded: LoadedModel, outcome, *, pool) -> None:
        """Compile `job`'s tuned model (and on a GPU its build without CUDA graphs) on `pool`, with the records
        `finish` would apply (a fleet builds its models' artifacts at once); `finish` then times those builds."""
        from ..clients.compiler import uses_cuda_graphs

        records = self._records_to_apply(job, outcome)
        variants = {self._artifact_path(job, loaded): None}
        if uses_cuda_graphs(job.target):
            variants[self._no_graph_path(job)] = False
        self._ahead[job.label] = (records, {path: pool.submit(self._compile, job, path=path, database=records,
                                                              cuda_graph=graphs)
                                            for path, graphs in variants.items()})

    def _artifact_path(self, job: ShareJob, loaded: LoadedModel) -> str:
        return os.path.join(self.out, f"{loaded.name}-{job.label}.so")

    @staticmethod
    def _no_graph_path(job: ShareJob) -> str:
        return os.path.join(job.work_dir, "tuned-no-cuda-graph.so")

    def finish(self, job: ShareJob, loaded: LoadedModel, outcome, session: ShareSession,
                untuned: Measured) -> TuneResult:
        from ..clients.compiler import uses_cuda_graphs
        from ..records.database import count_trials, repaired_bytes

        finish_started = time.perf_counter()
        artifact = self._artifact_path(job, loaded)
        records, built = self._ahead.pop(job.label, (None, {}))
        records = records if records is not None else self._records_to_apply(job, outcome)
        try:
            tuned = self._measure(job, session, path=artifact, database=records, what="the tuned model",
                                  built=built.get(artifact))
        except (numerics.NumericsRefused, TunedBuildFailed, LatencyFailed) as refused:
            for future in built.values():  # built with records that are no longer applied
                concurrent.futures.wait([future])
            built = {}
            tuned = self._without_kernels(job, session, artifact, records, outcome, refused)
            if tuned is None:
                records = self._without_broken_records(job, session, outcome, records, refused)
                tuned = self._measure(job, session, path=artifact, database=records, what="the tuned model")
        self._kernel_rows(job, outcome.tasks + outcome.extra.get("fused_kernels", []))
        from ..frontend.precision import fp32_kept, skipped_steps
        from .efficiency import annotate_efficiency

        extra = {"precision": job.precision, "precision_fallback": self.precision_fallbacks.get(job.label),
                 "fp32_kept": fp32_kept(job.prepared), "skipped_steps": skipped_steps(job.prepared),
                 "cuda_graph": uses_cuda_graphs(job.target),
                 "numerics": {"bound": self._bound(job).to_dict(), "untuned": untuned.numerics,
                              "tuned": tuned.numerics},
                 "tensor_cores": _tensor_core_counts(outcome.tasks)}
        environment = session.environment()
        roofline = annotate_efficiency(outcome.tasks, gpu_name=environment.get("gpu_name"),
                                       sm_count=environment.get("sm_count_at_share"), precision=job.precision)
        if roofline is not None:  # a GPU of known peaks: tasks[].efficiency against it
            extra["roofline"] = roofline
        if uses_cuda_graphs(job.target):  # what the graphs buy: the same records, compiled without them
            plain = self._measure(job, session, path=self._no_graph_path(job), database=records, cuda_graph=False,
                                  what="the tuned model without CUDA graphs", built=built.get(self._no_graph_path(job)))
            extra["latency_without_cuda_graph_ms"] = plain.latency
        extra["artifact_choice"] = self._never_slower(untuned, tuned, artifact)
        if extra["artifact_choice"] == "untuned":
            extra["rejected_tuned_build_ms"] = tuned.latency
            tuned = Measured(artifact, untuned.latency, untuned.numerics)
        report = tune_report(model=loaded.path or f"<torch module {loaded.name}>", job=job, config=self.config, outcome=outcome, untuned=untuned.latency,
                             tuned=tuned.latency, environment=environment, started=self.started,
                             artifact=artifact, share_choice=self.share_choice or {"mode": "fixed",
                                                                                   "chosen": job.label},
                             repaired_bytes=repaired_bytes(job.db_dir))
        report.update(extra)
        self._describe(loaded, job, untuned.path, share_label=None, trials=0, db_dir=None)
        self._describe(loaded, job, artifact, share_label=job.label, trials=count_trials(job.db_dir), db_dir=job.db_dir)
        report["command_s"] = {**self._step.times, "tuning_wall_s": round(outcome.wall_s, 3),
                               "finish_s": round(time.perf_counter() - finish_started, 3)}
        name = "report.json" if len(self.shares) == 1 else f"report-{job.label}.json"
        path = write_report(report, self.out, name=name)
        return TuneResult(share=job.label, out_dir=self.out, records_dir=job.db_dir, artifact=artifact,
                          report_path=path, untuned_ms=untuned.latency["median_ms"],
                          tuned_ms=tuned.latency["median_ms"], trials=outcome.trials_done, wall_s=report["wall_s"],
                          report=report)

    @staticmethod
    def _describe(loaded: LoadedModel, job: ShareJob, artifact: str, *, share_label, trials: int, db_dir,
                  extra: dict | None = None) -> None:
        """The JSON beside the artifact that tunekit.load / run / bench read (deploy.metadata)."""
        from ..deploy.metadata import metadata_for, write_metadata

        meta = metadata_for(loaded=loaded, target=job.target, share_label=share_label, precision=job.precision,
                            tuned_trials=trials, db_dir=db_dir, prepared_mod=job.prepared)
        meta.extra.update(extra or {})
        write_metadata(artifact, meta)

    @staticmethod
    def _never_slower(untuned: Measured, tuned: Measured, artifact: str) -> str:
        """Records that are each faster alone can still make the whole model slower (seen with the
        µs-scale kernels of the transformer example). The artifact is never slower than the
        untuned model: if the tuned build measured slower, the untuned build is shipped instead."""
        if tuned.latency["median_ms"] <= untuned.latency["median_ms"]:
            return "tuned"
        log.warning("the tuned model measured slower than the untuned one (%.4f > %.4f ms): shipping the untuned "
                    "build", tuned.latency["median_ms"], untuned.latency["median_ms"])
        shutil.copyfile(untuned.path, artifact + ".tmp")
        os.replace(artifact + ".tmp", artifact)
        return "untuned"


def _tensor_core_counts(tasks: list[dict]) -> dict:
    return {"tasks": len(tasks), "tasks_tensorized": sum(1 for t in tasks if t.get("best_tensorized")),
            "candidates_tensorized": sum(t.get("tensorized_trials", 0) for t in tasks)}


def _scheduled(tasks: list) -> list:
    """The tasks built as they are (fused attention): never searched, but kernels of another kind may beat them."""
    from ..frontend.tasks import already_scheduled

    return [t for t in tasks if already_scheduled(t)]


def _unscheduled(tasks: list) -> list:
    """The tasks that still need a schedule (extraction also lists functions already scheduled)."""
    from ..frontend.tasks import already_scheduled

    return [t for t in tasks if not already_scheduled(t)]
