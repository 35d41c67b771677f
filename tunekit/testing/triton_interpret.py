"""Run a GEMM plan's Triton kernel (kernels.triton_gemm) or a fused attention's (kernels.triton_attention) on the
CPU, in Triton's interpreter, in a process of its own: the interpreter patches triton.language while it runs, after
which a compile in the same process fails.

  python -m tunekit.testing.triton_interpret IN.npz OUT.npy

IN.npz holds `plan` (a GEMM's) or `spec` (an attention's) and `config` (JSON text) and `p<i>`, the task's parameters
in order; OUT.npy gets the output. Needs Triton and torch (CPU) on the path.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np


def interpret(plan, config, params: list[np.ndarray], *, work: str) -> np.ndarray:
    """The output the kernel of `plan` at `config` computes from `params` (the task's parameters in order)."""
    import dataclasses

    src, out = os.path.join(work, "interpret-in.npz"), os.path.join(work, "interpret-out.npy")
    np.savez(src, plan=json.dumps(plan.as_dict()), config=json.dumps(dataclasses.asdict(config)),
             **{f"p{i}": p for i, p in enumerate(params)})
    return _run(src, out)


def interpret_attention(spec, config, params: list[np.ndarray], *, work: str) -> np.ndarray:
    """The context the attention kernel of `spec` at `config` computes from `params` (q, k, v, mask, out)."""
    import dataclasses

    from ..kernels.triton_attention import spec_json

    src, out = os.path.join(work, "interpret-in.npz"), os.path.join(work, "interpret-out.npy")
    np.savez(src, spec=spec_json(spec), config=json.dumps(dataclasses.asdict(config)),
             **{f"p{i}": p for i, p in enumerate(params)})
    return _run(src, out)


def _run(src: str, out: str) -> np.ndarray:
    path = os.pathsep.join(p for p in sys.path if p)  # where this process found Triton and torch (.tritonsite)
    run = subprocess.run([sys.executable, "-m", "tunekit.testing.triton_interpret", src, out], capture_output=True,
                         text=True, env={**os.environ, "PYTHONPATH": path, "TRITON_INTERPRET": "1"}, timeout=600)
    if run.returncode != 0:
        raise RuntimeError(f"the interpreter failed: {run.stderr[-3000:]}")
    return np.load(out)


def _main_attention(data, out: str) -> None:
    import torch
    from ..kernels import triton_attention as ta

    spec = ta.spec_from_json(str(data["spec"]))
    config = ta.AttentionConfig(**json.loads(str(data["config"])))
    params = [torch.from_numpy(np.ascontiguousarray(data[f"p{i}"])) for i in range(5)]
    ta.jit_function(spec, config)[(ta.grid(spec, config),)](*params)
    np.save(out, params[4].numpy())


def main(src: str, out: str) -> None:
    import torch

    from ..kernels.gemm_plan import GemmPlan
    from ..kernels.triton_gemm import TileConfig, grid, jit_function

    data = np.load(src)
    if "spec" in data.files:
        return _main_attention(data, out)
    plan = GemmPlan.from_dict(json.loads(str(data["plan"])))
    config = TileConfig(**json.loads(str(data["config"])))
    params = [torch.from_numpy(np.ascontiguousarray(data[f"p{i}"])) for i in range(len(data.files) - 2)]
    order = [plan.a, plan.b, *[o.param for o in plan.operands], plan.out]
    jit_function(plan, config)[(grid(plan, config),)](*[params[i] for i in order])
    np.save(out, params[plan.out].numpy())


if __name__ == "__main__":
    main(*sys.argv[1:3])
