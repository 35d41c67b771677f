"""A transformer's GEMM tasks, each as the kernel a tunekit run starts from (DLight's default schedule) and as every
Triton tile configuration (kernels.triton_gemm), side by side at MPS shares: µs, TFLOP/s, the fraction of the share's
fp16 tensor-core peak (run.efficiency), and the largest error against the task's own output in fp32 on the CPU.

The tasks are a dense layer's as tunekit prepares them (fp16, bias and the activation fused after the matmul), at
ViT-B/16's shapes by default (sequence 197: QKV, out-projection, fc1 with GELU, fc2), from a one-layer ONNX model
written here. fc2's long K is split (frontend.split_k): its task is the partial sums, without the task that adds
them up; `fc2_whole` is fc2 unsplit, one kernel with its bias. Each share's timing runs in a process pinned to the share (tunekit's share session: its own MPS
daemon), with TVM's time_evaluator. Needs a GPU and Triton.

  python benchmarks/gemm_kernels.py --gpu-pct 40,100 [--seq 197 --hidden 768 --mlp 3072] [--json F]
"""
from __future__ import annotations

import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)


def layers(seq: int, hidden: int, mlp: int) -> dict:
    """{name: (M, K, N, activation, split along K as tunekit does)} of one encoder layer's dense layers; fc2 also
    whole, as one kernel with its bias (is the split, made for MetaSchedule's kernels, still worth its second
    kernel with Triton's?)."""
    return {"qkv": (seq, hidden, 3 * hidden, None, True), "out_proj": (seq, hidden, hidden, None, True),
            "fc1_gelu": (seq, hidden, mlp, "gelu", True), "fc2": (seq, mlp, hidden, None, True),
            "fc2_whole": (seq, mlp, hidden, None, False)}


def dense_onnx(path: str, m: int, k: int, n: int, activation: str | None) -> str:
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    consts = [numpy_helper.from_array((rng.standard_normal((k, n)) * k ** -0.5).astype(np.float32), "w"),
              numpy_helper.from_array((rng.standard_normal((n,)) * 0.1).astype(np.float32), "b")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]),
             helper.make_node("Add", ["mm", "b"], ["y" if activation is None else "h"])]
    if activation == "gelu":
        consts += [numpy_helper.from_array(np.array(v, np.float32), name)
                   for v, name in ((0.5, "half"), (1.0, "one"), (2 ** 0.5, "sq"))]
        nodes += [helper.make_node("Div", ["h", "sq"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
                  helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["h", "e1"], ["g"]),
                  helper.make_node("Mul", ["g", "half"], ["y"])]
    graph = helper.make_graph(nodes, "dense", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, m, n])], consts)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def gemm_task(path: str, target, *, split_k: bool = True):
    """(the GEMM task's PrimFunc, its plan) of a dense model."""
    from tunekit.frontend.precision import prepare
    from tunekit.frontend.tasks import extract_tasks
    from tunekit.kernels.gemm_plan import plan_of
    from tunekit.metaschedule_env import import_for_target, prepare_metaschedule_logging
    from tunekit.run.session import load_model

    import_for_target("cuda")
    prepare_metaschedule_logging()
    prepared, _ = prepare(load_model(path).mod, target, precision="fp16", split_k=split_k)
    found = [(t.dispatched[0]["main"], plan_of(t.dispatched[0]["main"])) for t in extract_tasks(prepared, target)]
    return next(((f, p) for f, p in found if p is not None), (None, None))


def worker(args) -> None:
    """In the pinned process: each layer's task untuned (DLight) and as each Triton configuration; JSON lines."""
    import numpy as np
    import tvm
    from tvm.s_tir import dlight as dl

    from tunekit.kernels.triton_compile import arch_of, device_module
    from tunekit.kernels.triton_gemm import compile_gemm, launching_func, tile_configs
    from tunekit.run.efficiency import device_peak
    from tunekit.shares.mps import gpu_name
    from tunekit.shares.share import Share
    from tunekit.targets import target_for

    target = target_for(Share("gpu", 100))
    dev = tvm.cuda(0)
    peak = device_peak(gpu_name())
    share_peak = peak.tensor_fp16_tflops * min(1.0, dev.multi_processor_count / peak.sms) if peak else None
    work = tempfile.mkdtemp(prefix="tunekit-gemm-")
    for name, (m, k, n, activation, split) in layers(args.seq, args.hidden, args.mlp).items():
        func, plan = gemm_task(dense_onnx(os.path.join(work, f"{name}.onnx"), m, k, n, activation), target,
                               split_k=split)
        if plan is None:
            print(json.dumps({"task": name, "error": "no GEMM plan"}), flush=True)
            continue
        rng = np.random.default_rng(1)
        host = [(rng.standard_normal([int(s) for s in p.shape]) * 0.5).astype(str(p.dtype)) for p in func.params]
        want = _cpu_reference(func, host)
        with target:
            untuned = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                              dl.gpu.GeneralReduction(), dl.gpu.Fallback())(
                tvm.IRModule({"main": func}))
            builds = [("dlight", "untuned", tvm.compile(untuned, target=target))]
        configs = tile_configs(plan)[:args.configs] if args.configs else tile_configs(plan)
        for config in configs:
            try:
                kernel = compile_gemm(plan, config, arch=arch_of(target))
                with target:
                    lib = tvm.compile(tvm.IRModule({"main": launching_func(func, plan, kernel).with_attr(
                        "global_symbol", "main")}), target=target)
                lib.mod.import_module(device_module(kernel))
                builds.append(("triton", config.name, lib))
            except Exception as exc:  # a configuration Triton cannot compile (shared memory, say): its row says so
                print(json.dumps({"task": name, "kind": "triton", "config": config.name,
                                  "error": f"{type(exc).__name__}: {str(exc)[:200]}"}), flush=True)
        for kind, config, lib in builds:
            arrays = [tvm.runtime.tensor(a, device=dev) for a in host]
            timer = lib.mod.time_evaluator("main", dev, number=args.number, repeat=args.repeat)
            secs = sorted(timer(*arrays).results)
            got = arrays[-1].numpy().astype(np.float64)
            us = secs[len(secs) // 2] * 1e6
            tflops = plan.flops / us / 1e6
            print(json.dumps({"task": name, "m": m, "k": k, "n": n, "kind": kind, "config": config,
                              "median_us": round(us, 3), "tflops": round(tflops, 2),
                              "of_share_peak": round(tflops / share_peak, 4) if share_peak else None,
                              "max_abs_err": float(np.abs(got - want).max()), "ref_max": float(np.abs(want).max()),
                              "sm_count": dev.multi_processor_count}), flush=True)


def _cpu_reference(func, host):
    """The task's own output, from TVM's LLVM build of it on the CPU (fp32 where the task computes in fp32)."""
    import numpy as np
    import tvm

    lib = tvm.compile(tvm.IRModule({"main": func}), target="llvm")
    arrays = [tvm.runtime.tensor(a, tvm.cpu()) for a in host]
    lib["main"](*arrays)
    return arrays[-1].numpy().astype(np.float64)


def main(argv=None) -> None:
    from pinned_worker import rows_at_shares, share_parser

    parser = share_parser(__doc__, number=100)
    parser.add_argument("--seq", type=int, default=197)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--mlp", type=int, default=3072)
    parser.add_argument("--configs", type=int, default=0, help="only the first N tile configurations (0: all)")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    rows = rows_at_shares(os.path.abspath(__file__), args.gpu_pct, {
        "seq": args.seq, "hidden": args.hidden, "mlp": args.mlp, "configs": args.configs, "number": args.number,
        "repeat": args.repeat}, timeout_s=1800)
    print(table(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"seq": args.seq, "hidden": args.hidden, "mlp": args.mlp, "rows": rows}, fh, indent=1)


def table(rows: list[dict]) -> str:
    """Per share and task: the untuned kernel, the best Triton configuration within the fp16 bound, their ratio."""
    out = ["| share | task | untuned µs | best Triton | µs | / untuned | TFLOP/s | of the share's peak |",
           "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for share in dict.fromkeys(r["share"] for r in rows):
        for task in dict.fromkeys(r["task"] for r in rows if r["share"] == share):
            mine = [r for r in rows if r["share"] == share and r["task"] == task and "median_us" in r]
            base = next((r for r in mine if r["kind"] == "dlight"), None)
            right = [r for r in mine if r["kind"] == "triton" and r["max_abs_err"] <= 2e-2 * max(1.0, r["ref_max"])]
            best = min(right, key=lambda r: r["median_us"], default=None)
            if base is None or best is None:
                continue
            out.append(f"| {share} | {task} | {base['median_us']:.2f} | {best['config']} | {best['median_us']:.2f} | "
                       f"{best['median_us'] / base['median_us']:.3f} | {best['tflops']:.1f} | {best['of_share_peak']} |")
    return "\n".join(out)


if __name__ == "__main__":
    main()
