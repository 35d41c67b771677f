"""An artifact that carries one schedule per share, and picks at load time the one that runs fastest.

`tunekit tune --robust` over several shares writes `<model>-robust.so` with one entry per share the
model was tuned at (`main__gpu20`, `main__gpu40`, ...), each compiled with that share's records, and
`main`, the single set of schedules that measured best over all the shares (the static choice).
The weights are shared: the entries differ only in their kernels.

Why: a static per-task choice cannot be good at every share when the model's best kernels differ by
share (benchmarks/RESULTS.md, "share-robust choice"; the dual bound in records.robust). Under MPS a process sees only its share's SMs, and the share is what decides
which schedule is fastest, so the artifact asks the GPU: at load, each entry is timed a few times,
alternating, and the fastest one serves every call.

Nothing here imports TVM at import time.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field

DEFAULT_ENTRY = "main"
AUTO = "auto"
# Timing the entries at load: stop after this long (a CPU ResNet-18 runs 1.4 s on one core), but
# always run at least MIN_ROUNDS rounds, each entry once per round, so that no entry wins by luck
# of a single call.
CALIBRATION_BUDGET_S = 1.0
MIN_ROUNDS = 3
MAX_ROUNDS = 15


def symbol_suffix(label: str) -> str:
    """`label` as part of a function name: the static per-task choice's label, "robust-per-task",
    has hyphens, which no symbol may have (the build failed with an empty RuntimeError)."""
    return re.sub(r"\W", "_", label)


def entry_name(label: str) -> str:
    """The Relax function of the variant `label` (a share, or the static per-task choice)."""
    return f"{DEFAULT_ENTRY}__{symbol_suffix(label)}"


@dataclass(frozen=True)
class VariantChoice:
    """Which entry a loaded model calls: `label` is a share label, or None for `main`."""

    label: str | None
    entry: str
    how: str                        # "only" (no variants), "auto" (timed here), "asked" (the caller's)
    median_ms: dict = field(default_factory=dict)  # per label, when timed

    def to_dict(self) -> dict:
        return {"variant": self.label, "entry": self.entry, "how": self.how,
                "variant_median_ms": {k: round(v, 5) for k, v in self.median_ms.items()}}


def variants_of(extra: dict) -> dict[str, str]:
    """{share label: entry} that an artifact's metadata lists (empty for an artifact of one schedule)."""
    found = extra.get("variants") or {}
    return {str(label): str(entry) for label, entry in found.items()}


def choose_variant(vm, device, args: list, variants: dict[str, str], *, variant: str | None = AUTO,
                   budget_s: float = CALIBRATION_BUDGET_S) -> VariantChoice:
    """The entry to call. `variant`: "auto" times every entry on `args` here and takes the fastest;
    a share label takes that share's entry; None or "main" takes the static one. A label the
    artifact lacks is refused in one line (TunekitError) naming those it has."""
    from ..errors import TunekitError

    if not variants or variant in (None, DEFAULT_ENTRY):
        return VariantChoice(None, DEFAULT_ENTRY, "only" if not variants else "asked")
    if variant != AUTO:
        if variant not in variants:
            raise TunekitError(f"this artifact has no variant {variant!r}; it has: "
                               f"{', '.join(sorted(variants))} (or 'main', or 'auto')")
        return VariantChoice(variant, variants[variant], "asked")
    times = _time_entries(vm, device, args, variants, budget_s=budget_s)
    medians = {label: sorted(samples)[len(samples) // 2] for label, samples in times.items()}
    best = min(medians, key=lambda label: (medians[label], label))
    return VariantChoice(best, variants[best], AUTO, medians)


def _time_entries(vm, device, args: list, variants: dict[str, str], *, budget_s: float) -> dict[str, list]:
    """Each entry's call latencies in ms, in rounds that alternate the entries (a GPU's clocks and
    a neighbour's load drift over time; alternating spreads that over every entry alike)."""
    functions = {label: vm[entry] for label, entry in variants.items()}
    for function in functions.values():  # warm-up: loads the kernels, captures the CUDA graph
        function(*args)
    device.sync()
    # TVM times each call in C++ and synchronises the device around it, as the latency workers do
    timers = {label: vm.time_evaluator(entry, device, number=1, repeat=1, min_repeat_ms=0)
              for label, entry in variants.items()}
    times: dict[str, list] = {label: [] for label in timers}
    started = time.perf_counter()
    for round_index in range(MAX_ROUNDS):
        if round_index >= MIN_ROUNDS and time.perf_counter() - started > budget_s:
            break
        for label, timer in timers.items():
            times[label].append(float(timer(*args).results[0]) * 1e3)
    return times
