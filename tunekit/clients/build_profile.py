"""Where a candidate's build time goes, measured inside the build worker.

Per candidate: TIR passes (lowering and the device passes, PassTimingInstrument), NVRTC (the
registered `tvm_callback_cuda_compile`, timed by a wrapper), the rest of the codegen (LLVM host
code, CUDA source emission), and the export (linking the .so); plus the CUDA source size and the
largest explicit-unroll step the schedule asked for. The pool adds them up (BuildPool.profile()).
"""
from __future__ import annotations

import re
import time

_PASS_LINE = re.compile(r"^(\t*)([^:\t]+): (\d+)us \[(\d+)us\]")
_NVRTC = {"seconds": 0.0, "calls": 0, "source_bytes": 0}
_TIMED = False  # the callback is wrapped once per process (an ffi Function carries no marker)
# TVM 0.27's pass profiler keeps a per-thread stack of the passes it is in, and a pass that throws
# leaves its entry there. Every later build in that process then failed ("cannot print pass profile
# while still in a pass!") or crashed the worker in InstrumentBeforePass ("Subprocess terminated")
# until the pool recycled it, though most such candidates build without the profiler. So after the
# first build that throws, this process builds without it.
_PASS_TIMING = {"usable": True}
TOP_PASSES = 8


def time_nvrtc() -> None:
    """Wrap the CUDA compile callback of this (worker) process so its time is counted."""
    global _TIMED
    import tvm_ffi

    original = tvm_ffi.get_global_func("tvm_callback_cuda_compile", allow_missing=True)
    if original is None or _TIMED:
        return
    _TIMED = True

    def timed(code):
        started = time.perf_counter()
        try:
            return original(code)
        finally:
            _NVRTC["seconds"] += time.perf_counter() - started
            _NVRTC["calls"] += 1
            _NVRTC["source_bytes"] += len(code)

    tvm_ffi.register_global_func("tvm_callback_cuda_compile", timed, override=True)


_UNROLL = re.compile(r'"pragma_auto_unroll_max_step": (\d+)')


def max_unroll_step(script: str) -> int:
    """The largest `pragma_auto_unroll_max_step` in a module's TVMScript: how far codegen unrolls
    explicitly (TVM 0.27 has no Python statement visitor, so it is read off the script)."""
    return max([0, *map(int, _UNROLL.findall(script))])


def pass_self_times(rendered: str) -> dict[str, float]:
    """PassTimingInstrument.render() -> {pass name: its own seconds}; and "__total__": the top level."""
    times: dict[str, float] = {"__total__": 0.0}
    for line in rendered.splitlines():
        match = _PASS_LINE.match(line)
        if not match:
            continue
        depth, name, total_us, self_us = match.groups()
        times[name] = times.get(name, 0.0) + int(self_us) / 1e6
        if not depth:
            times["__total__"] += int(total_us) / 1e6
    return times


def build_with_profile(mod, target, export, *, config: dict | None = None):
    """Build `mod` (with `config` added to the PassContext's), then `export(rt_mod)`; returns
    (export's result, profile dict). Without the pass profiler (see _PASS_TIMING), the passes'
    time is counted in codegen_s."""
    from tvm.driver import build as tvm_build
    from tvm.ir.instrument import PassTimingInstrument
    from tvm.ir.transform import PassContext

    from . import cuda_compile

    nvrtc_before = dict(_NVRTC)
    fallbacks_before = cuda_compile.stats()["fallback"]
    started = time.perf_counter()
    instrument = PassTimingInstrument() if _PASS_TIMING["usable"] else None
    current = PassContext.current()
    try:
        with PassContext(opt_level=current.opt_level, config={**dict(current.config), **(config or {})},
                         instruments=[instrument] if instrument else []):
            rt_mod = tvm_build(mod, target=target)
            passes = pass_self_times(instrument.render()) if instrument else {"__total__": 0.0}
    except Exception:
        if instrument is not None:
            _PASS_TIMING["usable"] = False  # see _PASS_TIMING
        raise
    built = time.perf_counter()
    result = export(rt_mod)
    done = time.perf_counter()
    nvrtc = _NVRTC["seconds"] - nvrtc_before["seconds"]
    total_passes = passes.pop("__total__")
    top = dict(sorted(passes.items(), key=lambda kv: -kv[1])[:TOP_PASSES])
    return result, {"total_s": done - started, "passes_s": total_passes, "nvrtc_s": nvrtc,
                    "codegen_s": max(0.0, built - started - total_passes - nvrtc), "export_s": done - built,
                    "source_bytes": _NVRTC["source_bytes"] - nvrtc_before["source_bytes"],
                    "nvrtc_fallback": cuda_compile.stats()["fallback"] > fallbacks_before, "top_passes_s": top,
                    "pass_timed": instrument is not None}


class ProfileTotals:
    """The pool's sum over built candidates (main process)."""

    KEYS = ("total_s", "passes_s", "nvrtc_s", "codegen_s", "export_s", "source_bytes")

    def __init__(self):
        self.count = 0
        self.sums = {k: 0.0 for k in self.KEYS}
        self.passes: dict[str, float] = {}
        self.unroll: dict[int, int] = {}
        self.retried = 0       # built only with the storage-rewrite workaround (build_pool)
        self.tensor_core = 0   # candidates whose kernel uses tensor-core intrinsics
        self.nvrtc_fallback = 0  # compiled by TVM's callback: they needed more of libcu++ (cuda_compile)
        self.pass_timed = 0    # built with the pass profiler on (see _PASS_TIMING)

    def add(self, profile: dict) -> None:
        self.count += 1
        for key in self.KEYS:
            self.sums[key] += profile.get(key, 0.0)
        for name, secs in profile.get("top_passes_s", {}).items():
            self.passes[name] = self.passes.get(name, 0.0) + secs
        step = int(profile.get("max_unroll_step", 0))
        self.unroll[step] = self.unroll.get(step, 0) + 1
        self.retried += int(profile.get("retried_without_storage_rewrite", False))
        self.tensor_core += int(profile.get("tensor_core", False))
        self.nvrtc_fallback += int(profile.get("nvrtc_fallback", False))
        self.pass_timed += int(profile.get("pass_timed", False))

    def summary(self) -> dict:
        """Seconds per built candidate by phase (worker CPU-seconds, not wall), the heaviest passes,
        and how many candidates asked for each explicit-unroll step. Pass times are averaged over the
        candidates built with the pass profiler on."""
        n, timed = max(1, self.count), max(1, self.pass_timed)
        per = {k: v / (timed if k == "passes_s" else n) for k, v in self.sums.items()}
        return {"candidates": self.count, **{f"{k.removesuffix('_s')}_per_candidate_s"
                                             if k.endswith("_s") else f"{k}_per_candidate": round(v, 4)
                                             for k, v in per.items()},
                "pass_timed_candidates": self.pass_timed,
                "top_passes_per_candidate_s": {k: round(v / timed, 4) for k, v in
                                               sorted(self.passes.items(), key=lambda kv: -kv[1])[:TOP_PASSES]},
                "max_unroll_step_candidates": dict(sorted(self.unroll.items())),
                "tensor_core_candidates": self.tensor_core, "built_without_storage_rewrite": self.retried,
                "nvrtc_fallback_candidates": self.nvrtc_fallback}
