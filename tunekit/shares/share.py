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

    # ---- CPU shares: a disjoint-able core set of the right size ----
    def cpu_cores(self, *, first_core: int = 0) -> list[int]:
        """Cores this share is pinned to: pct of the cores this process may use, at least one."""
        available = sorted(os.sched_getaffinity(0))
        count = max(1, round(len(available) * self.pct / 100))
        start = first_core % len(available)
        return [available[(start + i) % len(available)] for i in range(count)]


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
