"""`tunekit run` and `tunekit bench`: use a compiled model without writing code."""
from __future__ import annotations

from ..errors import TunekitError
from .common import EXIT_OK, emit

ARTIFACT_HELP = ("a compiled model (.so, its metadata .json beside it), or the out dir of a tunekit tune run "
                 "that holds one")


def add_run(p) -> None:
    p.add_argument("artifact", help=ARTIFACT_HELP)
    p.add_argument("--input", action="append", metavar="NAME=FILE.npy",
                   help="an input from a .npy file (repeat for several; inputs not given are random)")
    p.add_argument("--output", metavar="OUT.npz", help="write every output here (keys: the output names)")
    p.add_argument("--device", help="cpu, cuda or cuda:N (default: the artifact's own)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")


def _inputs(specs: list[str] | None) -> dict[str, str]:
    inputs = {}
    for spec in specs or []:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise TunekitError(f"--input {spec!r}: expected NAME=FILE.npy")
        inputs[name] = path
    return inputs


def run_command(args) -> int:
    from ..deploy import run_once

    result = run_once(args.artifact, inputs=_inputs(args.input), output=args.output, device=args.device,
                      seed=args.seed)
    lines = [f"{o['name']}: shape {o['shape']} {o['dtype']}" for o in result["outputs"]]
    lines.append(f"ran in {result['wall_ms']:.3f} ms" + (f"; outputs in {result['output_path']}"
                                                         if result.get("output_path") else ""))
    emit(args, result, "\n".join(lines))
    return EXIT_OK


def add_bench(p) -> None:
    p.add_argument("artifact", help=ARTIFACT_HELP)
    p.add_argument("--gpu-pct", type=int, help="measure at this share of the GPU's SMs (MPS)")
    p.add_argument("--cpu-pct", type=int, help="measure at this share of the CPU cores")
    p.add_argument("--repeats", type=int, default=100)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--compare-onnx", metavar="MODEL.onnx",
                   help="also run onnxruntime on CPU on the same inputs: max abs / rel error and cosine per output")
    p.add_argument("--allow-unenforced-share", action="store_true",
                   help="GPU without MPS: measure on the whole GPU, labelled UNENFORCED")
    p.add_argument("--variant", default="auto",
                   help="a share-robust artifact (tune --robust): the share whose schedules to run, 'main' for "
                        "its static choice, or 'auto' (default: time them all here and run the fastest)")


def bench_command(args) -> int:
    from ..deploy import bench

    result = bench(args.artifact, gpu_pct=args.gpu_pct, cpu_pct=args.cpu_pct, repeats=args.repeats,
                   warmup=args.warmup, compare_onnx=args.compare_onnx,
                   allow_unenforced_share=args.allow_unenforced_share, variant=args.variant)
    where = f"{result.sm_count} SMs" if result.sm_count else f"{result.cores} cores"
    lines = [f"{result.share} ({where}{'' if result.share_enforced else ', UNENFORCED'}): "
             f"p50 {result.p50_ms:.4f} ms, p90 {result.p90_ms:.4f} ms, p99 {result.p99_ms:.4f} ms, "
             f"{result.throughput_per_s:.1f} inferences/s ({result.repeats} runs after {result.warmup} warm-up)"]
    if result.variant:  # a share-robust artifact: which share's schedules ran here, and why
        timed = ", ".join(f"{label} {ms:.4f} ms" for label, ms in (result.variant_median_ms or {}).items())
        lines.append(f"  ran its variant {result.variant}" + (f" (timed at load: {timed})" if timed else ""))
    for row in (result.numerics or {}).get("outputs", []):
        lines.append(f"  vs onnxruntime: {row['name']}: max abs {row['max_abs_err']:.3g}, "
                     f"max rel {row['max_rel_err']:.3g}, cosine {row['cosine']:.6f}")
    emit(args, result.to_dict(), "\n".join(lines))
    return EXIT_OK
