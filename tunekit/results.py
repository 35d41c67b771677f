"""What the Python API returns: one dataclass per command, each with `to_dict()` for `--json`.

Kept free of TVM imports so that `import tunekit` (and `tunekit --help`) stays fast.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


class _AsDict:
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass
class TuneResult(_AsDict):
    """One share tuned: where its records, compiled model and report are, and the latency gained."""

    share: str
    out_dir: str
    records_dir: str
    artifact: str
    report_path: str
    untuned_ms: float
    tuned_ms: float
    trials: int
    wall_s: float
    report: dict = field(repr=False, default_factory=dict)

    @property
    def speedup(self) -> float:
        return self.untuned_ms / self.tuned_ms if self.tuned_ms else float("nan")


@dataclass
class SharesResult(_AsDict):
    """Several shares tuned in one run: one TuneResult (and one database) per share."""

    out_dir: str
    report_path: str
    results: list[TuneResult]
    report: dict = field(repr=False, default_factory=dict)


@dataclass
class FleetResult(_AsDict):
    """Several models tuned as one fleet: each model's TuneResult (its own out dir under `out_dir`), or the
    one line that says why it failed; report.json at the top compares them."""

    out_dir: str
    report_path: str
    results: dict[str, TuneResult]
    failed: dict[str, str]
    report: dict = field(repr=False, default_factory=dict)


@dataclass
class SloResult(_AsDict):
    """`tune --slo-ms`: the smallest candidate share whose tuned latency met the SLO (see tunekit.slo)."""

    slo_ms: float
    kind: str                  # "cpu" or "gpu"
    met: bool
    chosen: str | None         # the smallest share that met the SLO (None when none did)
    tuned_ms: float | None     # tuned median latency at `chosen`
    best_share: str | None     # the tried share with the lowest tuned latency (== chosen when met)
    best_ms: float | None
    out_dir: str
    summary_path: str          # <out>/slo.json
    candidates: list[dict]     # every candidate share: untuned (profile) latency and status
    tried: list[dict]          # the shares that were tuned, smallest first
    profile: dict = field(repr=False, default_factory=dict)
    max_speedup: float | None = None

    def share_choice(self) -> dict:
        return {"mode": "slo", "slo_ms": self.slo_ms, "met": self.met, "chosen": self.chosen,
                "tuned_ms": self.tuned_ms, "best_share": self.best_share, "best_ms": self.best_ms,
                "max_speedup": self.max_speedup, "tried": self.tried, "candidates": self.candidates}


@dataclass
class EvalResult(_AsDict):
    """`evaluate`: one row per (tuned at, run at) pair: latency, and numerics against onnxruntime."""

    model: str
    records: str
    results: list[dict]


@dataclass
class ProfileResult(_AsDict):
    """`profile`: the untuned model's latency at each share, and the knee of that curve."""

    model: str
    kind: str
    tolerance: float
    repeats: int
    shares: list[dict]   # smallest share first: share, pct, median_ms, std_ms, enforced, cores/sm_count
    knee: str

    def row(self, label: str) -> dict:
        return next(r for r in self.shares if r["share"] == label)
