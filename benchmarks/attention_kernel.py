"""The fused attention kernel alone (tunekit/frontend/attention_kernel.py), each body that can run the shape
(tensor cores, CUDA cores, or where K and V do not fit a block the key-tiled one): µs per call at MPS shares, and
its largest error against numpy in fp64.

BERT-base's shapes by default (Q, K, V read in place from the combined [1, S, 3 * H * D] projection
output, a [1, 1, S, S] mask). Each share's timing runs in a process pinned to the share (tunekit's
share session: its own MPS daemon), with TVM's time_evaluator (`--number` back-to-back calls,
median of `--repeat`). Needs a GPU.

  python benchmarks/attention_kernel.py --gpu-pct 40,100 [--heads 12 --seq 128 --dim 64] [--json F]
  python benchmarks/attention_kernel.py --gpu-pct 40 --seq 197      # ViT-B/16: the key-tiled body

Beside the hand-written bodies, each Triton flash configuration a tune measures (kernels.triton_attention; Triton
installed), unless --no-triton.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


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
    want = reference(spec, qkv.numpy())
    # every body that can run this shape: all keys at once (tensor cores, CUDA cores), or a tile at a time
    bodies = [("mma" if tc else "simt", {"tensor_cores": tc}) for tc in (True, False) if plan(spec, tensor_cores=tc)]
    if plan(spec) is None and plan(spec, key_tiles=True) is not None:
        bodies.append(("flash", {"key_tiles": True}))
    for body, options in bodies:
        shape = plan(spec, **options)
        with target:
            kernel = attention_kernel(spec, **options)
            lib = tvm.compile(tvm.IRModule({"main": kernel}), target=target)
        timer = lib.mod.time_evaluator("main", dev, number=args.number, repeat=args.repeat)
        secs = sorted(timer(qkv, qkv, qkv, mask, out).results)
        got = out.numpy().astype(np.float64).transpose(0, 2, 1, 3)
        print(json.dumps({"body": body, "median_us": round(secs[len(secs) // 2] * 1e6, 3),
                          "min_us": round(secs[0] * 1e6, 3), "blocks": shape.query_tiles * spec.heads,
                          "threads": shape.threads, "shared_bytes": shape.shared_bytes, "key_tile": shape.key_tile,
                          "max_abs_err": float(np.abs(got - want).max()), "sm_count": dev.multi_processor_count}))
    if args.triton and not args.no_triton:
        _triton_rows(spec, target, (qkv, mask, out), want, args)


def _triton_rows(spec, target, arrays, want, args) -> None:
    """Each Triton flash configuration (kernels.triton_attention) a tune measures for this attention, timed the same
    way: one JSON line each."""
    import numpy as np
    import tvm

    from tunekit.frontend.attention_kernel import attention_kernel
    from tunekit.kernels.candidates import compiled_launch, configs_of
    from tunekit.kernels.triton_compile import arch_of

    qkv, mask, out = arrays
    dev = tvm.cuda(0)
    func = attention_kernel(spec, key_tiles=True)
    for name in configs_of(func):
        try:
            launching, device = compiled_launch(func, name, arch=arch_of(target))
            with target:
                lib = tvm.compile(tvm.IRModule({"main": launching.with_attr("global_symbol", "main")}), target=target)
            lib.mod.import_module(device)
            out.copyfrom(np.zeros(out.shape, "float16"))
            secs = sorted(lib.mod.time_evaluator("main", dev, number=args.number, repeat=args.repeat)(
                qkv, qkv, qkv, mask, out).results)
        except Exception as exc:  # a configuration that does not build or run here is a row, not the end
            print(json.dumps({"body": f"triton {name}", "error": str(exc).splitlines()[0][:300]}))
            continue
        got = out.numpy().astype(np.float64).transpose(0, 2, 1, 3)
        print(json.dumps({"body": f"triton {name}", "median_us": round(secs[len(secs) // 2] * 1e6, 3),
                          "min_us": round(secs[0] * 1e6, 3), "max_abs_err": float(np.abs(got - want).max()),
                          "sm_count": dev.multi_processor_count}))


def reference(spec, qkv):
    """softmax(Q K^T scale) V in fp64, [B, H, S, D], of bert_like's combined projection (the mask is zeros)."""
    import numpy as np

    parts = qkv.astype(np.float64).reshape(1, spec.seq, 3, spec.heads, spec.head_dim).transpose(2, 0, 3, 1, 4)
    k, q, v = parts  # K first, as frontend.combine orders them
    s = np.einsum("bhid,bhjd->bhij", q, k) * spec.scale
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bhij,bhjd->bhid", p / p.sum(-1, keepdims=True), v)


def main(argv=None) -> None:
    from pinned_worker import rows_at_shares, share_parser

    parser = share_parser(__doc__, number=200)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--no-triton", action="store_true", help="the hand-written bodies only")
    parser.add_argument("--triton", type=int, default=1, help=argparse.SUPPRESS)  # the worker's form of it
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    rows = rows_at_shares(os.path.abspath(__file__), args.gpu_pct, {
        "heads": args.heads, "seq": args.seq, "dim": args.dim, "number": args.number, "repeat": args.repeat,
        "triton": int(not args.no_triton)},
        timeout_s=600)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"heads": args.heads, "seq": args.seq, "dim": args.dim, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
