"""How many kernels one inference launches, and which, once a model is prepared for a target:
the structure the fp16 passes (frontend/half.py, combine.py, reshapes.py) change. Runs anywhere
(no GPU: a CUDA target prepares and extracts on a CPU).

  python benchmarks/kernel_launches.py MODEL.onnx [--precision fp16] [--target nvidia/nvidia-h100] [--json]

Prints the number of launches (call_tir in main), the kernels that only cast, the dtype each
LayerNorm writes, and the count per kernel; --json for a machine-readable line.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def launches(prepared) -> list[tuple[str, str]]:
    """(kernel name, output dtype) of every call_tir in main, in order."""
    from tvm import relax

    out = []
    for block in prepared["main"].body.blocks:
        for binding in block.bindings:
            call = binding.value
            if isinstance(call, relax.Call) and getattr(call.op, "name", None) == "relax.call_tir":
                out.append((call.args[0].name_hint, str(getattr(binding.var.ty, "dtype", ""))))
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--precision", default="fp16", choices=["fp16", "fp32"])
    parser.add_argument("--target", default="nvidia/nvidia-h100", help="a TVM target tag")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)

    from tvm.target import Target

    from tunekit.frontend.precision import prepare
    from tunekit.run.session import load_model

    prepared, precision = prepare(load_model(args.model).mod, Target(args.target), precision=args.precision)
    rows = launches(prepared)
    family = collections.Counter(re.sub(r"\d+", "", name) for name, _ in rows)
    summary = {"model": args.model, "target": args.target, "precision": precision, "launches": len(rows),
               "cast_only": sum(1 for name, _ in rows if re.fullmatch(r"cast\d*", name)),
               "layer_norm_dtypes": dict(collections.Counter(d for n, d in rows if "layer_norm" in n)),
               "per_kernel": dict(family.most_common())}
    if args.json:
        print(json.dumps(summary))
        return
    print(f"{args.model}: {len(rows)} launches ({precision}, {args.target}); kernels that only cast: "
          f"{summary['cast_only']}; LayerNorm outputs: {summary['layer_norm_dtypes']}")
    for name, count in family.most_common():
        print(f"  {count:4d}  {name}")


if __name__ == "__main__":
    main()
