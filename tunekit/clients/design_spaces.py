"""Design spaces that survive TVM's tensor-core tiling rule failing on a task.

In TVM 0.27, MultiLevelTilingTensorCore raises ScheduleError ("The scope ... is not a stage pipeline", from the
ComputeAt of the wmma.matrix_b cache read) for some sampled tile sizes of a tensor-core conv whose output rows are
padded to a multiple of 16: ResNet-18's 14x14 and 7x7 convs in fp16 NHWC. Nothing in MetaSchedule catches it, so one
bad draw ended a whole run before its first trial. With ResNet-18 on sm_90a that was 12 of 60 seeds with tunekit's
search, and 9 of 60 with stock `ms.tune_tasks`, seed 0 among them.

The same rule fails on every draw for a 1x1 conv on a 1x1 input in fp16 NHWC (squeeze-excitation): its M = N*H*W
iterator has extent 1 and folds to the constant 0 in the tensor-core block layout, so padding M to 16 leaves the A
operand a 1x16 region that no 16x16 wmma load tiles (TileWithTensorIntrin gives nothing, and the rule calls `.value()`
on it: RuntimeError "Back optional access"); the mma rule's partitioned tile of that loop gives -1 (ScheduleError
in `split`).

- tunekit's own search draws a task's spaces again after a ScheduleError (`generate_design_spaces`).
- A task whose space no draw makes gets the same rules without the tensorizing ones (`fallback_context`):
  for CUDA exactly MetaSchedule's "cuda" rules, whose SIMT traces the context's tensor-core postprocs and mutators
  accept; a GEMV (M = 1) has nothing to gain from tensor cores. Rewriting it as a matmul would change its workload.
- Stock's `ms.tune_tasks` makes every space inside its C++ `Tune`, where nothing can retry. The stock engine
  therefore starts from the first seed whose spaces can all be made (`stock_seed`), and hands Tune the fallback
  context of each task whose space fails on any seed (`stock_contexts`).
"""
from __future__ import annotations

import logging

from ..errors import TunekitError

log = logging.getLogger("tunekit.search")

DRAWS = 8       # draws per task before giving up; a failing draw was about 1 in 20 in the seeds above
SEED_TRIES = 8  # seeds the stock engine tries
# Schedule rules that tile a block for a tensor intrinsic; a task's fallback rules are its rules without them.
TENSORIZING_RULES = ("MultiLevelTilingTensorCore", "MultiLevelTilingWithIntrin")


class NoDesignSpace(TunekitError):
    """No design space can be made for a task, with its own rules or the fallback ones (one line).
    `.task` names the task and `.reason` is the first error, in one line."""

    def __init__(self, task: str, reason: str):
        self.task, self.reason = task, reason
        super().__init__(f"task {task}: TVM cannot make its design space ({reason})")


def _summary(exc: BaseException) -> str:
    """An error of TVM's in one line: for a ScheduleError which primitive failed and why (its text also holds the
    whole IR); for any other error its type and first line."""
    from tvm.s_tir.schedule import ScheduleError

    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not isinstance(exc, ScheduleError):
        return f"{type(exc).__name__}: {lines[0] if lines else '(no message)'}"[:300]
    head = lines[0] if lines else type(exc).__name__
    why = next((line.removeprefix("Error message:").strip() for line in lines if line.startswith("Error message:")), "")
    return f"{head} {why}".strip()[:300]


def _copy_context(ctx, space):
    """A context like ctx (its workload, target, search strategy and random state) with the space generator
    `space`. Making it initializes it once, as Tune's TaskRecord initializes ctx."""
    from tvm.s_tir import meta_schedule as ms

    strategy = ctx.search_strategy.clone() if ctx.search_strategy is not None else None
    return ms.TuneContext(ctx.mod, target=ctx.target, space_generator=space, search_strategy=strategy,
                          task_name=str(ctx.task_name), rand_state=int(ctx.rand_state), num_threads=ctx.num_threads)


def _as_tune_will(ctx):
    """A twin of ctx as Tune's TaskRecord will have it, initialized again: probing it leaves ctx as it is."""
    return _copy_context(ctx, ctx.space_generator.clone())


def fallback_context(ctx):
    """A copy of `ctx` whose space generator has ctx's schedule rules without the tensorizing ones, and ctx's
    postprocs and mutators (all cloned); None where ctx has no such rule to drop. Its random state is ctx's, so
    the same seed gives the same spaces."""
    from tvm.s_tir import meta_schedule as ms

    generator = ctx.space_generator
    rules = list(getattr(generator, "sch_rules", None) or [])
    kept = [rule for rule in rules if type(rule).__name__ not in TENSORIZING_RULES]
    if not isinstance(generator, ms.space_generator.PostOrderApply) or len(kept) == len(rules):
        return None
    space = ms.space_generator.PostOrderApply(
        sch_rules=[rule.clone() for rule in kept], postprocs=[p.clone() for p in generator.postprocs],
        mutator_probs={mutator.clone(): float(getattr(prob, "value", prob))
                       for mutator, prob in generator.mutator_probs.items()})
    return _copy_context(ctx, space)


def _draw(ctx, draws: int) -> tuple[list | None, BaseException | None, int]:
    """(spaces, None, draws made) from ctx's first draw that works, else (None, first error, draws made).
    A new draw follows only a ScheduleError (sampled tiles that fail); any other error fails every draw."""
    from tvm.s_tir.schedule import ScheduleError

    first = None
    for draw in range(1, draws + 1):
        try:
            return ctx.generate_design_space(), None, draw
        except ScheduleError as exc:
            first = first or exc
        except Exception as exc:  # noqa: BLE001 - deterministic (e.g. "Back optional access"): no new draw
            return None, first or exc, draw
    return None, first, draws


def generate_design_spaces(ctx, *, draws: int = DRAWS) -> list:
    """`ctx.generate_design_space()`, drawn again when a tiling rule's sampled tiles fail (ScheduleError).

    Each draw forks the context's random state anew, so a run with a given seed stays the same run. After any
    other error, or `draws` ScheduleErrors, the spaces come from `fallback_context(ctx)` (drawn the same way):
    ctx's own search takes them. Raises NoDesignSpace (one line, with the first error) when they fail too."""
    spaces, first, draw = _draw(ctx, draws)
    if spaces is not None:
        if draw > 1:
            log.warning("task %s: its design space was drawn %d times (TVM's tensor-core tiling rule failed on "
                        "the first %d)", ctx.task_name, draw, draw - 1)
        return spaces
    fallback = fallback_context(ctx)
    if fallback is not None:
        spaces, _, _ = _draw(fallback, draws)
        if spaces is not None:
            log.info("task %s: no tensor-core design space (%s); it is searched without tensor cores",
                     ctx.task_name, _summary(first))
            return spaces
    raise NoDesignSpace(str(ctx.task_name), _summary(first))


def draw_at_once(contexts: list, *, threads: int, before=None) -> list:
    """generate_design_spaces of every context, on `threads` threads at once: a future each. TVM draws outside the
    GIL, each context from its own random state, so the spaces are the ones drawn one after another. `before(i)`
    runs first in context i's draw (a test's injected fault)."""
    import concurrent.futures

    def draw(i: int):
        if before is not None:
            before(i)
        return generate_design_spaces(contexts[i])

    with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(contexts))),
                                               thread_name_prefix="tunekit-spaces") as pool:
        return [pool.submit(draw, i) for i in range(len(contexts))]


def _first_draw_error(ctx, *, initialize: bool = True) -> tuple[bool, str] | None:
    """None when stock's Tune can make ctx's space, else (whether a ScheduleError, the error in one line).
    initialize: first initialize ctx again, as TaskRecord(ctx, weight) does inside TaskScheduler.Tune (a context
    made by _copy_context already is)."""
    from tvm.s_tir.meta_schedule import _ffi_api
    from tvm.s_tir.schedule import ScheduleError

    if initialize:
        _ffi_api.TuneContextInitialize(ctx)
    try:
        ctx.generate_design_space()
    except Exception as exc:  # noqa: BLE001 - ScheduleError depends on the seed; anything else fails on all
        return isinstance(exc, ScheduleError), _summary(exc)
    return None


def stock_seed(tasks, work_dir: str, *, threads: int, seed: int, tries: int = SEED_TRIES) -> tuple[int, dict]:
    """The first seed, from `seed` on, with which stock `ms.tune_tasks` can make every task's design space, and
    {seed passed over: {task: error}}.

    It repeats what `TaskScheduler.Tune` does first, on contexts made with that seed. Tune's TaskRecord
    initializes each context again, which forks its random state again, and then generates the space. A task that
    fails otherwise than by ScheduleError fails on every seed: it does not count here (see `stock_contexts`)."""
    from tvm.s_tir import meta_schedule as ms

    from ..metaschedule_env import prepare_metaschedule_logging

    passed_over: dict[int, dict] = {}
    for candidate in range(seed, seed + tries):
        prepare_metaschedule_logging()
        contexts, _ = ms.relax_integration.extracted_tasks_to_tune_contexts(tasks, work_dir, num_threads=threads,
                                                                            seed=candidate)
        errors = {str(ctx.task_name): _first_draw_error(ctx) for ctx in contexts}
        failures = {task: error[1] for task, error in errors.items() if error is not None and error[0]}
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


def stock_contexts(contexts, weights) -> tuple[list, list, dict]:
    """Stock's contexts and weights, each task whose own rules fail otherwise than by ScheduleError (on every seed)
    with its fallback context instead, less the tasks whose fallback fails too (they keep their untuned kernel),
    and {task left out: the first error, in one line}."""
    kept, kept_weights, left_out = [], [], {}
    for ctx, weight in zip(contexts, weights):
        error = _first_draw_error(_as_tune_will(ctx), initialize=False)
        if error is not None and not error[0]:
            fallback = fallback_context(ctx)
            if fallback is None or _first_draw_error(_as_tune_will(fallback), initialize=False) is not None:
                left_out[str(ctx.task_name)] = error[1]
                continue
            ctx = fallback
        kept.append(ctx)
        kept_weights.append(weight)
    return kept, kept_weights, left_out
