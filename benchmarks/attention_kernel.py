"""The fused attention kernel alone (tunekit/frontend/attention_kernel.py), its tensor-core and its
CUDA-core body: µs per call at MPS shares.

BERT-base's shapes by default (Q, K, V read in place from the combined [1, S, 3 * H * D] projection
output, a [1, 1, S, S] mask). Each share's timing runs in a process pinned to the share (tunekit's
share session: its own MPS daemon), with TVM's time_evaluator (`--number` back-to-back calls,
median of `--repeat`). Needs a GPU.

  python benchmarks/attention_kernel.py --gpu-pct 40,100 [--heads 12 --seq 128 --dim 64] [--json F]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bert_like(heads: int, seq: int, dim: int):
    """The Attention spec of one BERT layer: K, Q, V column ranges of the combined projection."""
    from tunekit.frontend.attention_kernel import Attention, Operand

    cols = 3 * heads * dim

    def view(offset):
        return Operand((1, seq, cols), "float16", offset, (seq * cols, dim, cols, 1))

    mask = Operand((1, 1, seq, seq), "float16", 0, (0, 0, seq, 1))
    return Attention(1, heads, seq, seq, dim, view(heads * dim), view(0), view(2 * heads * dim), mask, dim ** -0.5)


def worker(args) -> None:
    """In the pinned process: compile for this GPU, time, print one JSON line."""
    import numpy as np
    import tvm

    from tunekit.frontend.attention_kernel import attention_kernel, plan
    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    spec = bert_like(args.heads, args.seq, args.dim)
    target = target_for(Share("gpu", 100))
    dev = tvm.cuda(0)
    rng = np.random.default_rng(0)
    qkv = tvm.runtime.tensor(rng.standard_normal(spec.q.shape).astype("float16"), device=dev)
    mask = tvm.runtime.tensor(np.zeros(spec.mask.shape, "float16"), device=dev)
    out = tvm.runtime.tensor(np.zeros((1, spec.seq, spec.heads, spec.head_dim), "float16"), device=dev)
    for tensor_cores in (True, False):
        shape = plan(spec, tensor_cores=tensor_cores)
        with target:
            kernel = attention_kernel(spec, tensor_cores=tensor_cores)
            lib = tvm.compile(tvm.IRModule({"main": kernel}), target=target)
        timer = lib.mod.time_evaluator("main", dev, number=args.number, repeat=args.repeat)
        secs = sorted(timer(qkv, qkv, qkv, mask, out).results)
        print(json.dumps({"body": "mma" if shape.tensor_cores else "simt", "median_us": round(secs[len(secs) // 2] * 1e6, 3),
                          "min_us": round(secs[0] * 1e6, 3), "blocks": shape.query_tiles * spec.heads,
                          "threads": shape.threads, "shared_bytes": shape.shared_bytes,
                          "sm_count": dev.multi_processor_count}))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu-pct", default="40,100")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--number", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)

    from tunekit.run.session import ShareSession
    from tunekit.shares.share import Share

    rows = []
    for pct in (int(p) for p in args.gpu_pct.split(",")):
        with ShareSession(Share("gpu", pct), allow_unenforced=False) as session:
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", *[f"--{k}={v}" for k, v in (
                ("heads", args.heads), ("seq", args.seq), ("dim", args.dim), ("number", args.number),
                ("repeat", args.repeat))]]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, **session.pinned.popen_kwargs())
            if proc.returncode != 0:
                sys.exit(f"gpu{pct}: {proc.stderr[-2000:]}")
            for line in proc.stdout.strip().splitlines():
                if line.startswith("{"):
                    rows.append({"share": f"gpu{pct}", **json.loads(line)})
                    print(json.dumps(rows[-1]), flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"heads": args.heads, "seq": args.seq, "dim": args.dim, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
