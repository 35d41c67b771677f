"""Design spaces that survive a bad draw of TVM's tensor-core tiling rule.

In TVM 0.27, MultiLevelTilingTensorCore raises ScheduleError ("The scope ... is not a stage pipeline", from the
ComputeAt of the wmma.matrix_b cache read) for some sampled tile sizes of a tensor-core conv whose output rows are
padded to a multiple of 16: ResNet-18's 14x14 and 7x7 convs in fp16 NHWC. Nothing in MetaSchedule catches it, so one
bad draw ended a whole run before its first trial. With ResNet-18 on sm_90a that was 12 of 60 seeds with tunekit's
search, and 9 of 60 with stock `ms.tune_tasks`, seed 0 among them.

- tunekit's own search draws that task's spaces again (`generate_design_spaces`).
- Stock's `ms.tune_tasks` makes every space inside its C++ `Tune`, where nothing can retry. The stock engine
  therefore starts from the first seed whose spaces can all be made (`stock_seed`).
"""
from __future__ import annotations

import logging

from ..errors import TunekitError

log = logging.getLogger("tunekit.search")

DRAWS = 8       # draws per task before giving up; a failing draw was about 1 in 20 in the seeds above
SEED_TRIES = 8  # seeds the stock engine tries


def _summary(exc: Exception) -> str:
    """A ScheduleError in one line: which primitive failed and why (its text also holds the whole IR)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    head = lines[0] if lines else type(exc).__name__
    why = next((line.removeprefix("Error message:").strip() for line in lines if line.startswith("Error message:")), "")
    return f"{head} {why}".strip()


def generate_design_spaces(ctx, *, draws: int = DRAWS) -> list:
    """`ctx.generate_design_space()`, drawn again when the tiling rule fails.

    Each draw forks the context's random state anew, so a run with a given seed stays the same run. After `draws`
    failures it raises a one-line TunekitError naming the task."""
    from tvm.s_tir.schedule import ScheduleError

    for draw in range(1, draws + 1):
        try:
            spaces = ctx.generate_design_space()
        except ScheduleError as exc:
            if draw == draws:
                raise TunekitError(f"task {ctx.task_name}: TVM could not make its design space in {draws} draws "
                                   f"({_summary(exc)}); try another --seed") from None
            continue
        if draw > 1:
            log.warning("task %s: its design space was drawn %d times (TVM's tensor-core tiling rule failed on "
                        "the first %d)", ctx.task_name, draw, draw - 1)
        return spaces
    raise AssertionError("unreachable")


def stock_seed(tasks, work_dir: str, *, threads: int, seed: int, tries: int = SEED_TRIES) -> tuple[int, dict]:
    """The first seed, from `seed` on, with which stock `ms.tune_tasks` can make every task's design space, and
    {seed passed over: {task: error}}.

    It repeats what `TaskScheduler.Tune` does first, on contexts made with that seed. Tune's TaskRecord
    initializes each context again, which forks its random state again, and then generates the space."""
    from tvm.s_tir import meta_schedule as ms
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm.s_tir.schedule import ScheduleError

    from ..metaschedule_env import prepare_metaschedule_logging

    passed_over: dict[int, dict] = {}
    for candidate in range(seed, seed + tries):
        prepare_metaschedule_logging()
        contexts, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, work_dir, num_threads=threads,
                                                                            seed=candidate)
        failures = {}
        for ctx in contexts:
            _ffi_api.TuneContextInitialize(ctx)  # as TaskRecord(ctx, weight) does inside TaskScheduler.Tune
            try:
                ctx.generate_design_space()
            except ScheduleError as exc:
                failures[str(ctx.task_name)] = _summary(exc)
        if not failures:
            if passed_over:
                log.warning("stock MetaSchedule cannot start with seed%s %s (TVM's tensor-core tiling rule fails "
                            "on %s): it runs with seed %d", "s" if len(passed_over) > 1 else "",
                            ", ".join(map(str, passed_over)), ", ".join(sorted({t for f in passed_over.values()
                                                                               for t in f})), candidate)
            return candidate, passed_over
        passed_over[candidate] = failures
    raise TunekitError(f"stock MetaSchedule cannot make its design spaces with seeds {seed}..{seed + tries - 1} "
                       f"(last: {passed_over[seed + tries - 1]})")
