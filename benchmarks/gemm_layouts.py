"""One GEMM's Triton kernels (kernels.triton_gemm, every tile configuration) with the weight laid out [K, N] and [N, K],
beside torch.matmul (cuBLAS) on the same operands, at MPS shares: µs per call (CUDA events over 30 back-to-back calls),
the best tile's TFLOP/s and its fraction of the share's fp16 tensor-core peak, and each kernel's largest error against
fp32 on the GPU. With --floors, each shape's floor at the share: a kernel that does nothing (timed the same way) plus
the longer of its FLOPs at the share's peak and its bytes at the share's copy bandwidth (torch's device-to-device
copy of 256 MB), so the best tile's fraction of the peak is set beside the most that floor allows; and the best
tile's own floor: the empty kernel plus its grid's waves (ceil(programs / SMs)), each one program's padded tile
(block_m x block_n x K) at one SM's share of the peak, and the lowest such floor over the tiles tried.

Why: a weight [K, N] whose rows are not 16-byte multiples (GPT-2's LM head, N = 50257) cannot be loaded in 16-byte
vectors; frontend.aligned_weights stores it [N, K]. Each share's timing runs in a process pinned to the share
(tunekit's share session: its own MPS daemon). Needs a GPU, torch and Triton; not TVM's build.

  python benchmarks/gemm_layouts.py --gpu-pct 40 [--shapes 512x768x50257,512x768x50304] [--out-dtypes float32,float16]
  python benchmarks/gemm_layouts.py --gpu-pct 40 --shapes 197x768x3072,512x768x3072,512x3072x768 --layouts kn --graphs 1
  python benchmarks/gemm_layouts.py --gpu-pct 40 --shapes 197x768x2304,197x768x3072 --layouts kn --graphs 1 --floors 1
  python benchmarks/gemm_layouts.py --table gemm_layouts.json   # a saved run's table again
"""
from __future__ import annotations

import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

SHAPES = "512x768x50257,512x768x50304"  # M x K x N: GPT-2's LM head at sequence 512, and N padded to 64


def _time_us(fn, *, number: int, graphs: bool) -> float:
    """Mean µs of `fn` over `number` calls; with `graphs`, of 10 calls captured in a CUDA graph, replayed `number`
    times (no launch cost)."""
    import torch

    for _ in range(3):
        fn()
    if graphs:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(10):
                fn()
        call, per_call = graph.replay, 10
    else:
        call, per_call = fn, 1
    call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(number):
        call()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / number / per_call * 1000


def _floors(args) -> dict:
    """A kernel's fixed cost (one that stores one element, timed as the tiles are) and the copy bandwidth here."""
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def nothing(out):
        tl.store(out, 1.0)

    one = torch.empty(1, device="cuda")
    src = torch.empty(256 << 20, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    copy_us = _time_us(lambda: dst.copy_(src), number=20, graphs=False)
    return {"empty_kernel_us": round(_time_us(lambda: nothing[(1,)](one), number=args.number, graphs=args.graphs), 3),
            "copy_gbps": round(2 * src.numel() / copy_us / 1e3, 1)}  # read and written


def worker(args) -> None:
    """In the pinned process: every shape, layout and output dtype, one JSON line each."""
    import torch

    from tunekit.kernels import triton_gemm
    from tunekit.kernels.gemm_plan import GemmPlan

    sms = torch.cuda.get_device_properties(0).multi_processor_count
    floors = _floors(args) if args.floors else {}
    for shape in args.shapes.split(","):
        m, k, n = (int(x) for x in shape.split("x"))
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        for layout in args.layouts.split(","):
            b = torch.randn(n, k, device="cuda", dtype=torch.float16) if layout == "nk" else \
                torch.randn(k, n, device="cuda", dtype=torch.float16)
            b_kn = b.t() if layout == "nk" else b
            want = a.float() @ b_kn.float()
            cublas = _time_us(lambda: a @ b_kn, number=args.number, graphs=args.graphs)
            for out_dtype in args.out_dtypes.split(","):
                plan = GemmPlan(m=m, n=n, k=k, a=0, b=1, b_transposed=layout == "nk", out=2, in_dtype="float16",
                                out_dtype=out_dtype, operands=(), epilogue=(), result="acc")
                out = torch.empty(m, n, device="cuda", dtype=getattr(torch, out_dtype))
                tiles = {}
                for config in triton_gemm.tile_configs(plan):
                    kernel, grid = triton_gemm.jit_function(plan, config), triton_gemm.grid(plan, config)

                    def launch(kernel=kernel, grid=grid, config=config):
                        kernel[(grid,)](a, b, out, num_warps=config.warps, num_stages=config.stages)
                    launch()
                    torch.cuda.synchronize()
                    error = float((out.float() - want).abs().max() / want.abs().max())
                    tiles[config.name] = [round(_time_us(launch, number=args.number, graphs=args.graphs), 2),
                                          round(error, 5)]
                best = min(tiles, key=lambda name: tiles[name][0])
                tflops = 2 * m * n * k / tiles[best][0] / 1e6
                print(json.dumps({"shape": shape, "layout": layout, "out_dtype": out_dtype, "sm_count": sms,
                                  "gpu": torch.cuda.get_device_name(0),
                                  "cublas_us": round(cublas, 2), "best": best, "best_us": tiles[best][0],
                                  "best_tflops": round(tflops, 1), "tiles": tiles, **floors,
                                  "bytes": 2 * (m * k + k * n) + out.element_size() * m * n}), flush=True)


def floor_us(row: dict, share_peak_tflops: float) -> tuple[float, float]:
    """(the row's floor in µs, its FLOPs): the empty kernel's cost plus the longer of compute at the share's peak
    and bytes at its copy bandwidth."""
    m, k, n = (int(x) for x in row["shape"].split("x"))
    flops = 2 * m * n * k
    return row["empty_kernel_us"] + max(flops / share_peak_tflops / 1e6, row["bytes"] / row["copy_gbps"] / 1e3), flops


def tile_floor_us(row: dict, tile: str, share_peak_tflops: float) -> float:
    """The tile's floor in µs: the empty kernel's cost plus its grid's waves, each a padded tile at one SM's peak."""
    m, k, n = (int(x) for x in row["shape"].split("x"))
    block_m, block_n = (int(x) for x in re.match(r"m(\d+)n(\d+)", tile).groups())
    programs = -(-m // block_m) * -(-n // block_n)
    waves = -(-programs // row["sm_count"])
    return row["empty_kernel_us"] + waves * 2 * block_m * block_n * k / (share_peak_tflops / row["sm_count"]) / 1e6


def print_table(rows: list[dict]) -> None:
    """The rows as a markdown table (with the floors where the run measured them)."""
    from tunekit.run.efficiency import device_peak

    floors = (" floor µs | most of the peak the floor allows | best tile's floor µs | of it reached |"
              " lowest tile floor µs | most of the peak it allows |"
              if "empty_kernel_us" in rows[0] else "")
    print("| share | M x K x N | weight | out | best Triton tile | µs | TFLOP/s | of the share's peak | cuBLAS µs | cuBLAS of the peak |"
          + floors)
    print("| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |" + " ---: | ---: | ---: | ---: | ---: | ---: |" * bool(floors))
    for row in rows:
        peak = device_peak(row["gpu"])
        share_peak = peak.tensor_fp16_tflops * min(1.0, row["sm_count"] / peak.sms) if peak else float("nan")
        m, k, n = (int(x) for x in row["shape"].split("x"))
        line = (f"| {row['share']} | {row['shape']} | [{'N, K' if row['layout'] == 'nk' else 'K, N'}] | "
                f"{row['out_dtype']} | {row['best']} | {row['best_us']} | {row['best_tflops']} | "
                f"{row['best_tflops'] / share_peak:.0%} | {row['cublas_us']} | "
                f"{2 * m * n * k / row['cublas_us'] / 1e6 / share_peak:.0%} |")
        if floors:
            us, flops = floor_us(row, share_peak)
            tile_us = tile_floor_us(row, row["best"], share_peak)
            lowest = min(tile_floor_us(row, tile, share_peak) for tile in row["tiles"])
            line += (f" {us:.2f} | {flops / us / 1e6 / share_peak:.0%} | {tile_us:.2f} | {tile_us / row['best_us']:.0%} |"
                     f" {lowest:.2f} | {flops / lowest / 1e6 / share_peak:.0%} |")
        print(line)


def main(argv=None) -> None:
    from pinned_worker import rows_at_shares, share_parser

    parser = share_parser(__doc__, number=30)
    parser.add_argument("--shapes", default=SHAPES, help="M x K x N, comma-separated")
    parser.add_argument("--layouts", default="kn,nk", help="the weight as [K, N] (kn), as [N, K] (nk)")
    parser.add_argument("--out-dtypes", default="float32,float16")
    parser.add_argument("--graphs", type=int, default=0, help="1: time CUDA-graph replays (no launch cost)")
    parser.add_argument("--floors", type=int, default=0, help="1: each shape's floor at the share (see above)")
    parser.add_argument("--table", metavar="JSON", help="print the table of a saved --json run (no GPU)")
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args)
    if args.table:  # a saved run's rows, no GPU needed
        with open(args.table) as fh:
            return print_table(json.load(fh)["rows"])
    rows = rows_at_shares(os.path.abspath(__file__), args.gpu_pct, {
        "shapes": args.shapes, "layouts": args.layouts, "out-dtypes": args.out_dtypes, "number": args.number,
        "graphs": args.graphs, "floors": args.floors}, timeout_s=600)
    print_table(rows)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
