"""Persistent build workers: one pool of processes for the whole run.

Stock `LocalBuilder` starts a fresh `PopenPoolExecutor` for every batch, so each batch pays a
TVM import per worker (with torch imported too, enough for the default timeout to kill most first
candidates). Here the pool is made once and warmed
up in the background while tasks are extracted. A candidate that exceeds its timeout kills only
its own worker process (PopenPoolExecutor restarts it on the next submit).

The builder also finishes the artifact so that the runner only loads and runs it:
- CPU: the module is linked into a shared library here (stock exports a tar that the runner
  server links with the system compiler inside the timed session).
- CUDA: `tvm_callback_cuda_compile` is registered (clients.cuda_compile), and the codegen then
  embeds a cubin compiled by NVRTC in the builder; without it the module carries CUDA source
  that NVRTC compiles when the runner loads it (~0.8 s per kernel, inside the session).
"""
from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import dataclass

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.builder import BuilderInput, BuilderResult, PyBuilder

from .build_config import build_configs, uses_tensor_cores
from .build_profile import ProfileTotals

# Workers are recycled after this many builds: TVM notes a slow memory growth in long-lived
# Popen workers, and a restart every few hundred builds costs nothing measurable.
_RECYCLE_AFTER = 256


@dataclass
class BuildTiming:
    build_s: float  # compile + export inside the worker
    ok: bool


def _worker_init(cores: list[int] | None, cuda_aot: bool, nice: int = 0) -> None:
    if cores:
        os.sched_setaffinity(0, cores)
    if nice:
        os.nice(nice)
    # Import TVM once per worker, not per batch. Not all of `tvm.s_tir.tensor_intrin` (24 s on 2
    # cores), which stock imports in every worker; but a CUDA worker needs the CUDA intrinsics'
    # module: the mma codegen of a tensorized candidate looks up index-map functions registered
    # there (shared_16x16_to_ldmatrix_32x8_layout, ...; the stock builder's fix is TVM PR #18525).
    import tvm  # noqa: F401

    if cuda_aot:
        from .build_profile import time_nvrtc
        from .cuda_compile import install as install_cuda_compile
        from ..metaschedule_env import import_for_target

        install_cuda_compile()  # tvm_callback_cuda_compile: cubin at build time, without libcu++
        import_for_target("cuda")
        time_nvrtc()


def _build_one(mod, target, artifact_dir: str):
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    from .build_profile import build_with_profile, max_unroll_step

    started = time.perf_counter()
    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    script = mod.script()
    tensor_core = uses_tensor_cores(script)

    def export(rt_mod) -> str:
        fd, path = tempfile.mkstemp(prefix="cand-", suffix=".so", dir=artifact_dir)
        os.close(fd)
        rt_mod.export_library(path)  # a linked .so: the server only dlopens it
        return path

    configs = build_configs(target, tensor_core=tensor_core)
    for attempt, config in enumerate(configs):
        try:
            path, profile = build_with_profile(mod, target, export, config=config)
            break
        except Exception:
            if attempt == len(configs) - 1:
                raise
    profile.update(max_unroll_step=max_unroll_step(script), tensor_core=tensor_core,
                   retried_without_storage_rewrite=bool(config) and attempt > 0)
    return path, time.perf_counter() - started, profile


@derived_object
class BuildPool(PyBuilder):
    """A MetaSchedule builder whose worker processes live for the whole run.

    Usable anywhere a `Builder` is (including stock `ms.tune_tasks`); tunekit's tuning loop also
    reads the per-candidate build time from `last_timings`.
    """

    def __init__(self, *, workers: int, timeout_s: float, cores: list[int] | None = None,
                 cuda_aot: bool = True, artifact_dir: str | None = None, nice: int = 0):
        from tvm.support.popen_pool import PopenPoolExecutor

        super().__init__()
        self.workers = max(1, int(workers))
        self.timeout_s = timeout_s
        self.artifact_dir = artifact_dir or tempfile.mkdtemp(prefix="tunekit-build-")
        os.makedirs(self.artifact_dir, exist_ok=True)
        self.last_timings: list[BuildTiming] = []
        self.profile = ProfileTotals()  # where build time went, over every candidate built
        self._profile_lock = threading.Lock()
        self._pool = PopenPoolExecutor(max_workers=self.workers, timeout=timeout_s, initializer=_worker_init,
                                       initargs=(cores, cuda_aot, nice), maximum_process_uses=_RECYCLE_AFTER)
        # Start every worker now (TVM import ~1-2 s each) so the first batch does not wait for it.
        self.warm_s: float | None = None  # seconds from here until every worker had started
        self._created = time.perf_counter()
        self._warm_lock = threading.Lock()
        self._waiting_for_warm: list = []
        self._not_started = self.workers
        self._warm = [self._pool.submit(os.getpid) for _ in range(self.workers)]
        for started in self._warm:
            started.add_done_callback(self._one_started)

    def _one_started(self, _future) -> None:
        with self._warm_lock:
            self._not_started -= 1
            if self._not_started:
                return
            self.warm_s = time.perf_counter() - self._created
            callbacks, self._waiting_for_warm = self._waiting_for_warm, []
        for callback in callbacks:
            callback(self.warm_s)

    def wait_until_warm(self) -> None:
        """Block until every worker has started (imported TVM): timings after this exclude start-up."""
        for started in self._warm:
            started.result()

    def on_warm(self, callback) -> None:
        """`callback(warm_s)` once every worker has started (at once if they all have; else from a
        worker's thread). Nothing waits for it."""
        with self._warm_lock:
            if self.warm_s is None:
                self._waiting_for_warm.append(callback)
                return
        callback(self.warm_s)

    def build(self, build_inputs: list[BuilderInput]) -> list[BuilderResult]:
        """The whole batch (MetaSchedule's Builder interface): every result once the slowest is built."""
        results, timings = [], []
        for future in self.submit(build_inputs):
            result, timing = self.collect(future)
            results.append(result)
            timings.append(timing)
        self.last_timings = timings
        return results

    def submit(self, build_inputs: list[BuilderInput]) -> list:
        """One future per candidate, done as soon as that candidate is built (streaming: the search
        loop hands each to a runner at once instead of waiting for the batch's slowest)."""
        return [self._pool.submit(_build_one, inp.mod, inp.target, self.artifact_dir) for inp in build_inputs]

    def submit_call(self, fn, *args):
        """`fn(*args, artifact_dir)` in a build worker (a module-level function): a future of what it returns, an
        artifact's path (kernels of other kinds than MetaSchedule's: clients.kernel_trials)."""
        return self._pool.submit(fn, *args, self.artifact_dir)

    def collect(self, future) -> tuple[BuilderResult, BuildTiming]:
        """The BuilderResult of a finished `submit` future (a timeout or a failure is a result too)."""
        try:
            path, secs, profile = future.result()
        except TimeoutError:
            return (BuilderResult(None, f"tunekit BuildPool: timeout, killed after {self.timeout_s} s"),
                    BuildTiming(self.timeout_s, False))
        except Exception as exc:  # the worker's exception (or its death), as stock's map_with_error_catching
            return BuilderResult(None, f"tunekit BuildPool: build failed\n{exc}"), BuildTiming(0.0, False)
        with self._profile_lock:  # collected from several stage threads
            self.profile.add(profile)
        return BuilderResult(path, None), BuildTiming(secs, True)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False)
        for worker in list(self._pool._worker_map.values()):  # also one started while we unwound
            worker.kill()
