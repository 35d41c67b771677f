"""A share of a device: `gpu` percent of the SMs (enforced by CUDA MPS) or `cpu` percent of the cores."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..errors import TunekitError


@dataclass(frozen=True)
class Share:
    kind: str  # "cpu" or "gpu"
    pct: int

    def __post_init__(self):
        if self.kind not in ("cpu", "gpu"):
            raise TunekitError(f"share kind must be 'cpu' or 'gpu', not {self.kind!r}")
        if not isinstance(self.pct, int) or not 1 <= self.pct <= 100:
            raise TunekitError(f"--{self.kind}-pct must be an integer in 1..100, got {self.pct!r}")

    @property
    def label(self) -> str:
        return f"{self.kind}{self.pct}"

    @classmethod
    def from_label(cls, label: str) -> "Share":
        """'gpu40' -> Share("gpu", 40): the inverse of `label` (database dirs are named by it)."""
        try:
            return cls(label[:3], int(label[3:]))
        except ValueError:
            raise TunekitError(f"{label!r} is not a share label such as gpu40 or cpu50") from None

    # ---- CPU shares: a disjoint-able core set of the right size ----
    def cpu_cores(self, *, first_core: int = 0) -> list[int]:
        """Cores this share is pinned to: pct of the cores this process may use, at least one."""
        available = sorted(os.sched_getaffinity(0))
        count = max(1, round(len(available) * self.pct / 100))
        start = first_core % len(available)
        return [available[(start + i) % len(available)] for i in range(count)]


def share_kind(gpu_pct, cpu_pct) -> str:
    """Which kind of share a command is for: "gpu" when --gpu-pct is given, else "cpu" (the default,
    since a GPU is not guaranteed on laptops and CI machines). Both at once is refused."""
    if gpu_pct is not None and cpu_pct is not None:
        raise TunekitError("give either --gpu-pct or --cpu-pct, not both")
    return "gpu" if gpu_pct is not None else "cpu"


def parse_pct_list(text: str | int, *, kind: str) -> list[Share]:
    """'20,40,100' -> [Share(kind,20), ...]; clear error on anything else."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts:
        raise TunekitError(f"--{kind}-pct needs a value such as 40 or 20,40,100")
    shares = []
    for part in parts:
        try:
            pct = int(part)
        except ValueError:
            raise TunekitError(f"--{kind}-pct: {part!r} is not an integer percentage") from None
        shares.append(Share(kind, pct))
    return shares
