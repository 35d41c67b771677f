"""`tunekit check`: will this model tune on that GPU? Answered without the GPU (issue 55).

It runs what a tune runs before its first trial, for the target alone: the import (run.session), the
precision conversion and preparation (frontend.precision), task extraction (frontend.tasks), every task's
design space made as the search makes it (clients.design_spaces), and the untuned build with its CUDA
kernels compiled by NVRTC (offline_build). Each model problem is one line in `CheckResult.problems`; what
this machine lacks (NVRTC) only skips a step. Imports TVM only when `check` runs.
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field

from .errors import TunekitError

# Architectures TVM 0.27 builds CUDA for: Maxwell (sm_50) and newer.
NO_TRITON = "Triton is not installed here"  # a task's triton_error when nothing could be compiled for it
_ARCH = re.compile(r"sm_(\d{2,3})[af]?")


@dataclass(kw_only=True)
class TaskCheck:
    name: str
    weight: float                # calls of the task's kernel per model call
    spaces: int                  # design spaces made (0: none could be)
    tensorized: bool             # a space maps the task onto a tensor intrinsic (tensor cores on CUDA)
    fallback: str | None = None  # why the task would run its untuned kernel instead of being tuned
    triton_configs: int = 0      # Triton tile configurations a tune tries for it (a GEMM; clients.kernel_trials)
    triton_error: str | None = None  # why its first configuration did not compile for the target here


@dataclass(kw_only=True)
class CheckResult:
    model: str
    target: dict                 # targets.target_dict: Target(result.target) rebuilds it
    precision_requested: str     # auto | fp16 | fp32, as asked
    precision_wanted: str        # what that is on the target (auto: fp16 on a tensor-core GPU)
    precision: str | None        # what the model was prepared in (None: it could not be)
    tasks: list[TaskCheck] = field(default_factory=list)
    scheduled_tasks: int = 0     # hand-written kernels: built as they are, never searched
    scheduled_checks: list[TaskCheck] = field(default_factory=list)  # those a tune tries Triton kernels for
    untuned_build: str = "skipped"  # ok | failed | skipped (not run: NVRTC missing, or nothing to build)
    untuned_build_detail: str = ""
    problems: list[str] = field(default_factory=list)  # one line each; none: it tunes as asked
    fp32_kept: list[str] = field(default_factory=list)  # bindings the fp16 conversion kept in fp32 (not problems)
    seconds: float = 0.0

    @property
    def ready(self) -> bool:
        """The model tunes in the precision asked for, every task has a design space, the build did not fail."""
        return not self.problems

    @property
    def tensorized_tasks(self) -> int:
        return sum(t.tensorized for t in self.tasks)

    @property
    def triton_tasks(self) -> int:
        """Tasks whose Triton kernel compiled for the target here (a tune measures each of their configurations),
        the fused attentions' among them."""
        return sum(bool(t.triton_configs) and t.triton_error is None for t in self.tasks + self.scheduled_checks)

    @property
    def fallback_tasks(self) -> list[str]:
        return [t.name for t in self.tasks if t.fallback]

    def to_dict(self) -> dict:
        return {**dataclasses.asdict(self), "ready": self.ready, "tensorized_tasks": self.tensorized_tasks,
                "triton_tasks": self.triton_tasks, "fallback_tasks": self.fallback_tasks}

    def summary(self) -> str:
        name = os.path.basename(self.model)
        where = self.target.get("arch") or self.target.get("kind", "?")
        reasons = collections.Counter(t.fallback for t in self.tasks if t.fallback)
        why = "; ".join(f"{reason} x{n}" if n > 1 else reason for reason, n in reasons.items())
        scheduled = f", {self.scheduled_tasks} hand-written" if self.scheduled_tasks else ""
        verdict = "ready" if self.ready else f"NOT READY ({len(self.problems)} problem(s))"
        intrinsic = "a tensor-core space" if self.target.get("kind") == "cuda" else "a tensorized space"
        triton = f", {self.triton_tasks} with Triton kernels" if self.triton_tasks else ""
        return (f"{name} on {where}: {len(self.tasks)} tasks{scheduled}, {self.tensorized_tasks} with {intrinsic}"
                f"{triton}, "
                f"{self.precision or 'not prepared'}, {len(self.fallback_tasks)} would fall back "
                f"to their untuned kernel{f' ({why[:200]})' if why else ''}, untuned build {self.untuned_build}: "
                f"{verdict}")

    def report_lines(self) -> list[str]:
        """What `tunekit check` prints: one line per problem, the skipped build's reason, the summary."""
        skipped = [f"untuned build: skipped: {self.untuned_build_detail}"] if self.untuned_build == "skipped" \
            and self.untuned_build_detail else []
        kept = [f"precision: fp16, {len(self.fp32_kept)} binding(s) kept in fp32: {'; '.join(self.fp32_kept[:3])}"] \
            if self.fp32_kept else []
        checks = self.tasks + self.scheduled_checks
        triton = [f"task {t.name}: its Triton kernel does not compile here ({t.triton_error}); MetaSchedule's kernels only"
                  for t in checks if t.triton_error and t.triton_error != NO_TRITON]
        missing = sum(t.triton_error == NO_TRITON for t in checks)
        if missing:  # one line, not one per task: the machine lacks Triton, the tasks are fine
            triton.append(f"Triton kernels: not compiled for {missing} task(s): {NO_TRITON} (a tune on a machine "
                          "without it measures MetaSchedule's kernels only; pip install 'tunekit[gpu]')")
        return [*self.problems, *kept, *skipped, *triton, self.summary()]


# ---------------------------------------------------------------- the target
def gpu_arch_target(arch: str):
    """The target a tune uses on a GPU of `arch` ("sm_90", "sm_86"), built from its compute capability as
    targets.cuda_target builds it for a GPU it has no tag for."""
    from .targets import GpuInfo, cuda_target

    match = _ARCH.fullmatch(str(arch).strip().lower())
    digits = match.group(1) if match else ""
    if not digits or int(digits[:-1]) < 5:
        raise TunekitError(f"--gpu-arch must name an NVIDIA GPU architecture, sm_50 or newer (e.g. sm_90), "
                           f"not {arch!r}")
    return cuda_target(GpuInfo(f"sm_{digits}", (int(digits[:-1]), int(digits[-1]))))


def as_target(spec):
    """A TVM Target from a Target, a tag ("nvidia/nvidia-h100"), a JSON object or its text."""
    from tvm.target import Target

    if isinstance(spec, Target):
        return spec
    if isinstance(spec, str) and spec.lstrip().startswith("{"):
        try:
            spec = json.loads(spec)
        except json.JSONDecodeError as exc:
            raise TunekitError(f"--target is not valid JSON ({exc})") from None
    try:
        return Target(spec)
    except Exception as exc:
        raise TunekitError(f"--target {spec!r} is not a TVM target tag or JSON target ({_first_line(exc)})") from None


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


# ---------------------------------------------------------------- the steps
def _prepare(mod, target, result: CheckResult):
    """The prepared module, in the precision wanted or else fp32 (as a tune with `auto` falls back), with
    the refusal as a problem. None when the model cannot be prepared at all."""
    from .frontend.precision import prepare

    from .frontend.precision import fp32_kept

    try:
        prepared, result.precision = prepare(mod, target, precision=result.precision_wanted)
        result.fp32_kept = fp32_kept(prepared)
        return prepared
    except Exception as exc:  # TunekitError: TVM cannot convert it; anything else: a preparation pass failed
        refused = _first_line(exc)
    if result.precision_wanted == "fp32":
        result.problems.append(f"preparation: failed: {refused}")
        return None
    try:
        prepared, result.precision = prepare(mod, target, precision="fp32")
    except Exception as exc:
        result.problems += [f"precision: fp16 refused: {refused}", f"preparation: fp32 failed too: {_first_line(exc)}"]
        return None
    then = "fp32 used" if result.precision_requested == "auto" else "fp32 checked instead"
    result.problems.append(f"precision: fp16 refused: {refused}; {then}")
    return prepared


def _searched_tasks(prepared, target, result: CheckResult) -> list:
    from .frontend.tasks import already_scheduled, extract_tasks

    try:
        tasks = extract_tasks(prepared, target)
    except Exception as exc:
        result.problems.append(f"tasks: {_first_line(exc)}")
        return []
    searched = [t for t in tasks if not already_scheduled(t)]
    result.scheduled_tasks = len(tasks) - len(searched)
    for task in tasks:  # a fused attention: its Triton kernels are tried beside it (kernels.candidates)
        found = _triton_check(task.dispatched[0]["main"], target) if already_scheduled(task) else {}
        if found:
            result.scheduled_checks.append(TaskCheck(name=str(task.task_name), weight=float(task.weight), spaces=0,
                                                     tensorized=False, **found))
    return searched


def search_contexts(tasks: list, target, work_dir: str, *, config=None) -> tuple[list, list]:
    """(TuneContexts, weights) of `tasks` as a tune's search makes them: its evolutionary search strategy and
    seed (clients.search_loop.SearchLoop._make_tasks), the target's tensor intrinsics registered first."""
    from .clients.search_loop import search_contexts as contexts_of
    from .config import TuneConfig
    from .metaschedule_env import import_for_target

    import_for_target(target.kind.name)
    return contexts_of(tasks, target, work_dir, config=config or TuneConfig(), threads=1)


def _no_space_reason(exc: Exception, task_name: str) -> str:
    from .clients import design_spaces

    # NoDesignSpace (a one-line .reason) where clients.design_spaces has it; before that, its TunekitError
    no_space = getattr(design_spaces, "NoDesignSpace", TunekitError)
    reason = getattr(exc, "reason", None) if isinstance(exc, no_space) else None
    return str(reason or _first_line(exc)).removeprefix(f"task {task_name}: ")


def _task_checks(tasks: list, target, progress) -> list[TaskCheck]:
    """Every task's design spaces, made one task at a time: a task that fails is noted and the next goes on."""
    from .clients import task_faults
    from .clients.design_spaces import generate_design_spaces
    from .records.trace_keys import is_tensorized

    checks = []
    with tempfile.TemporaryDirectory(prefix="tunekit-check-") as work_dir:
        contexts, weights = search_contexts(tasks, target, work_dir)
        for task, ctx, weight in zip(tasks, contexts, weights):
            name = str(task.task_name)
            try:
                task_faults.raise_if_injected("design_space", name)  # as a tune would fail (tests)
                spaces = generate_design_spaces(ctx)
                checks.append(TaskCheck(name=name, weight=float(weight), spaces=len(spaces),
                                        tensorized=any(is_tensorized(s.trace) for s in spaces),
                                        **_triton_check(ctx.mod["main"], target)))
            except Exception as exc:
                checks.append(TaskCheck(name=name, weight=float(weight), spaces=0, tensorized=False,
                                        fallback=f"no design space: {_no_space_reason(exc, name)}"))
            progress.advance(1, status=name[:28])
    return checks


def _triton_check(func, target) -> dict:
    """A GEMM's or fused attention's Triton configurations, its first compiled for the target's architecture
    (Triton's own ptxas, no GPU): TaskCheck's triton fields. Nothing for another task or a CPU target; NO_TRITON as
    the error without Triton."""
    import importlib.util

    if target.kind.name != "cuda":
        return {}
    from .kernels.candidates import compile_kernel, configs_of
    from .kernels.triton_compile import arch_of

    try:
        configs = configs_of(func)
    except Exception:  # the planners cannot read it: no kernel of another kind for it
        return {}
    if not configs:
        return {}
    if importlib.util.find_spec("triton") is None:
        return {"triton_configs": len(configs), "triton_error": NO_TRITON}
    try:
        compile_kernel(func, configs[0], arch=arch_of(target))
    except Exception as exc:
        return {"triton_configs": len(configs), "triton_error": _first_line(exc)}
    return {"triton_configs": len(configs)}


def check(model, *, target, precision: str = "auto", input_shapes: dict | None = None,
          show_progress: bool = False) -> CheckResult:
    """Will `model` (an ONNX path) tune on `target` (a TVM Target, tag or JSON; see gpu_arch_target) in
    `precision`? Runs everything a tune runs before its first trial, with no GPU. Raises TunekitError for bad
    input (no such file, a bad target or precision); every problem of the model itself is in the result."""
    from .clients.progress import ProgressBar
    from .frontend.precision import resolve_precision
    from .offline_build import untuned_build
    from .run.session import load_model
    from .targets import target_dict

    started = time.perf_counter()
    target = as_target(target)
    name = os.fspath(model) if isinstance(model, (str, os.PathLike)) else type(model).__name__
    result = CheckResult(model=name, target=target_dict(target), precision_requested=precision,
                         precision_wanted=resolve_precision(precision, target), precision=None)
    try:
        loaded = load_model(model, input_shapes)
    except TunekitError:
        raise
    except Exception as exc:  # the importer failed on the model: a model problem, not bad usage
        result.problems.append(f"import: failed: {_first_line(exc)}")
        return result
    prepared = _prepare(loaded.mod, target, result)
    tasks = _searched_tasks(prepared, target, result) if prepared is not None else []
    progress = ProgressBar(total=len(tasks) + 1, show=show_progress and prepared is not None, label="checking")
    try:
        result.tasks = _task_checks(tasks, target, progress) if tasks else []
        result.problems += [f"task {t.name}: {t.fallback}" for t in result.tasks if t.fallback]
        if prepared is not None:
            progress.advance(0, status="untuned build")
            result.untuned_build, result.untuned_build_detail = untuned_build(prepared, target)
            if result.untuned_build == "failed":
                result.problems.append(f"untuned build: failed: {result.untuned_build_detail}")
            progress.advance(1)
    finally:
        progress.close()
    result.seconds = round(time.perf_counter() - started, 2)
    return result
