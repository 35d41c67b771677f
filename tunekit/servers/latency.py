"""End-to-end latency of a compiled model at a share, measured in a process pinned to it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from ..errors import TunekitError
from ..shares.pinning import PinnedEnv


# Up to `repeats` timed runs, but about this long at most (never under latency_worker.MIN_REPEATS runs):
# a model of a second per run on a small CPU share is timed 5 times, not 20 (tuning is what is slow).
MAX_TIMING_S = 6.0


def measure_latency(*, artifact: str, inputs: dict[str, np.ndarray], pinned: PinnedEnv, repeats: int,
                    timeout_s: float = 600) -> tuple[dict, list[np.ndarray]]:
    device = "cuda" if pinned.share.kind == "gpu" else "cpu"
    with tempfile.TemporaryDirectory(prefix="tunekit-lat-") as tmp:
        in_path, out_path = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
        np.savez(in_path, **inputs)  # npz keeps insertion order = the model's input order
        proc = subprocess.run([sys.executable, "-m", "tunekit.servers.latency_worker", artifact, in_path, device,
                               str(repeats), out_path, str(MAX_TIMING_S)], capture_output=True, text=True, timeout=timeout_s,
                              **pinned.popen_kwargs())
        if proc.returncode != 0:
            raise TunekitError(f"latency measurement at {pinned.share.label} failed: {proc.stderr.strip()[-400:]}")
        info = json.loads(proc.stdout.strip().splitlines()[-1])
        with np.load(out_path) as data:
            outputs = [data[k] for k in data.files]
    return info, outputs
