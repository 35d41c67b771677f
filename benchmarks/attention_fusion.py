"""Fewer kernels, side by side in one run (untuned, fp16, CUDA graphs): attention as one kernel
(frontend/attention.py) and the GPU kernel folds (frontend/fusion.py), against the graph without them.

Variants (`--variants`, default all three, in this order):
  unfused  neither: attention as Relax writes it, kernels cut by Relax's zero pipeline;
  fused    attention as one kernel;
  folded   attention as one kernel, and gathers and LayerNorm prologues folded (tunekit's default).
Each is the same model prepared by tunekit, compiled untuned (DLight) with CUDA graphs, and timed by
tunekit's latency worker at each share, one after the other under one MPS daemon; each is also
checked against onnxruntime fp32. Needs a GPU.

  python benchmarks/attention_fusion.py --model /tmp/vs/bert.onnx --gpu-pct 40,100 --repeats 200 \
      --json results/attention_fusion.json

Prints a markdown table: launches per inference, median ms per share, and each variant's speed-up
over the first.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

VARIANTS = {"unfused": (False, False), "fused": (True, False), "folded": (True, True)}  # (attention, folds)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--gpu-pct", default="40")
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--variants", default="unfused,fused,folded")
    parser.add_argument("--json")
    args = parser.parse_args(argv)

    from kernel_launches import launches
    from tunekit.clients.compiler import compile_and_export
    from tunekit.frontend.precision import prepare
    from tunekit.numerics import compare_outputs
    from tunekit.run.session import ShareSession, load_model
    from tunekit.servers.latency import measure_latency
    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    pcts = [int(p) for p in args.gpu_pct.split(",")]
    loaded = load_model(args.model)
    sample = loaded.inputs.random(seed=0)
    reference = loaded.reference(sample)
    target = target_for(Share("gpu", pcts[0]))
    rows = []
    with tempfile.TemporaryDirectory(prefix="tunekit-attn-") as tmp:
        artifacts = {}
        for variant in args.variants.split(","):
            fuse, fold = VARIANTS[variant]
            started = time.perf_counter()
            prepared, precision = prepare(loaded.mod, target, precision="fp16", fuse_attention=fuse,
                                          fold_kernels=fold)
            artifacts[variant] = compile_and_export(prepared_mod=prepared, target=target, database=None,
                                                    path=os.path.join(tmp, f"{variant}.so"))
            rows.append({"variant": variant, "precision": precision, "launches": len(launches(prepared)),
                         "attention_kernels": sum(n.startswith("fused_attention") for n, _ in launches(prepared)),
                         "build_s": round(time.perf_counter() - started, 1)})
            print(f"{variant}: {rows[-1]}", file=sys.stderr, flush=True)
        for pct in pcts:
            with ShareSession(Share("gpu", pct), allow_unenforced=False) as session:
                for row in rows:
                    info, outputs = measure_latency(artifact=artifacts[row["variant"]], inputs=sample,
                                                    pinned=session.pinned, repeats=args.repeats)
                    row[f"gpu{pct}_ms"] = info["median_ms"]
                    row["sm_count"] = {**row.get("sm_count", {}), f"gpu{pct}": session.sm_count}
                    row["numerics"] = compare_outputs(loaded.output_names, outputs, reference)
                    print(f"{row['variant']} gpu{pct}: {info['median_ms']:.4f} ms", file=sys.stderr, flush=True)
    table = ["| variant | launches | attention kernels | " + " | ".join(f"gpu{p} ms" for p in pcts)
             + " | max rel err |", "| --- | ---: | ---: | " + " | ".join("---:" for _ in pcts) + " | ---: |"]
    for row in rows:
        table.append(f"| {row['variant']} | {row['launches']} | {row['attention_kernels']} | "
                     + " | ".join(f"{row[f'gpu{p}_ms']:.4f}" for p in pcts)
                     + f" | {max(o['max_rel_err'] for o in row['numerics']):.2e} |")
    first = rows[0]
    for row in rows[1:]:
        table.append(f"| {first['variant']} / {row['variant']} | | | " + " | ".join(
            f"**{first[f'gpu{p}_ms'] / row[f'gpu{p}_ms']:.2f}x**" for p in pcts) + " | |")
    print("\n".join(table))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"model": os.path.abspath(args.model), "rows": rows, "table": table}, fh, indent=1, default=str)


if __name__ == "__main__":
    main()
