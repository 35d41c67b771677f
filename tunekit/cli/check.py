"""`tunekit check MODEL.onnx --gpu-arch sm_90`: will this model tune on that GPU? No GPU needed (tunekit.readiness).

Exit 0: it tunes in the precision asked for (auto: fp16 on a tensor-core GPU), every task has a design space and
the untuned build did not fail; 1: one of those is not so (one line each); 2: bad usage (no such file, bad arch).
"""
from __future__ import annotations

from .common import EXIT_ERROR, EXIT_OK, emit, input_shapes, show_progress


def add_arguments(p) -> None:
    p.add_argument("model", help="the ONNX model")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--gpu-arch", metavar="sm_90", help="the GPU's architecture (its compute capability)")
    where.add_argument("--target", metavar="TAG|JSON", help="a TVM target: a tag (nvidia/nvidia-h100) or JSON")
    p.add_argument("--precision", choices=["auto", "fp32", "fp16"], default="auto",
                   help="as tune's: auto is fp16 on tensor-core GPUs (sm_75+), else fp32 (default auto)")
    p.add_argument("--input-shape", action="append", metavar="NAME:1x3x224x224", help="fix a dynamic input's shape")


def run(args) -> int:
    from ..readiness import check, gpu_arch_target

    target = gpu_arch_target(args.gpu_arch) if args.gpu_arch else args.target
    result = check(args.model, target=target, precision=args.precision, input_shapes=input_shapes(args),
                   show_progress=show_progress(args))
    emit(args, result.to_dict(), "\n".join(result.report_lines()))
    return EXIT_OK if result.ready else EXIT_ERROR


# (help, how to add its arguments, what it runs): its row of cli._COMMANDS
COMMAND = ("will a model tune on that GPU? precision, every task's design space, the untuned build; no GPU needed",
           add_arguments, run)
