"""A GEMM task (kernels.gemm_plan) as a Triton kernel: its source for one tile configuration, compiled for the
target's GPU architecture (no GPU needed: Triton brings its own ptxas), and the task's PrimFunc that launches it.

The replacement PrimFunc keeps the task's parameters and calls the kernel with `call_packed`; the kernel's cubin
goes into the IRModule's `external_mods`, which the Relax build links into the artifact (TVM's own route for
`T.call_kernel`, python/tvm/tirx/script/builder/external_kernel.py). Triton emits wgmma and TMA on Hopper, which
MetaSchedule's tensor-core rules do not (issue 53).
"""
from __future__ import annotations

import dataclasses
import hashlib

from .triton_compile import CompiledKernel, ceil_pow2, compile_source, config_from_name, launching_call
from .triton_compile import jit_function as jit_function_of

_TRITON_POINTER = {"float16": "*fp16", "float32": "*fp32", "bfloat16": "*bf16"}
_TRITON_DTYPE = {"float16": "tl.float16", "float32": "tl.float32", "bfloat16": "tl.bfloat16"}
KIND = "triton"


@dataclasses.dataclass(frozen=True)
class TileConfig:
    """One Triton candidate of a GEMM: the output tile, the K step, warps and software-pipeline stages."""

    block_m: int
    block_n: int
    block_k: int
    warps: int
    stages: int
    group_m: int = 8  # output tiles of this many rows of tiles in a row before the next column (L2 reuse)

    @property
    def name(self) -> str:
        return f"m{self.block_m}n{self.block_n}k{self.block_k}w{self.warps}s{self.stages}g{self.group_m}"

    @classmethod
    def from_name(cls, name: str) -> TileConfig:
        return config_from_name(cls, r"m(\d+)n(\d+)k(\d+)w(\d+)s(\d+)g(\d+)", name, "tile configuration")


# The tiles most often best at 40% of an H200 first (kernel trials take each task's first few before any task's
# others), then Triton's matmul tutorial's configurations for Hopper and Ampere, smaller-M ones for a batch of a few
# rows, and deeper K steps for the short reductions of batch-1 transformers (K = 768: 12 steps of 64, 6 of 128)
# (benchmarks/results/h200-transformers-max-autotune, "GEMM tiles in CUDA graphs")
_CONFIGS = [TileConfig(64, 128, 64, 4, 3), TileConfig(128, 128, 32, 4, 4), TileConfig(128, 256, 64, 8, 3),
            TileConfig(128, 128, 64, 8, 3), TileConfig(64, 64, 128, 4, 3), TileConfig(128, 256, 32, 8, 4),
            TileConfig(64, 128, 128, 4, 3), TileConfig(128, 64, 64, 4, 3), TileConfig(64, 256, 32, 4, 4),
            TileConfig(128, 64, 32, 4, 4), TileConfig(64, 128, 32, 4, 4), TileConfig(128, 32, 32, 4, 4),
            TileConfig(64, 32, 32, 2, 5), TileConfig(32, 64, 32, 2, 5), TileConfig(64, 64, 64, 4, 3),
            TileConfig(32, 128, 64, 4, 3), TileConfig(16, 128, 64, 4, 3), TileConfig(16, 64, 64, 4, 4)]


def tile_configs(plan) -> list[TileConfig]:
    """The candidates worth measuring for `plan`: no tile larger than the problem needs (tl.dot takes 16 and up)."""
    return [c for c in _CONFIGS if c.block_m <= max(16, ceil_pow2(plan.m)) and c.block_n <= max(32, ceil_pow2(plan.n))
            and c.block_k <= max(32, ceil_pow2(plan.k))]


def supports(plan) -> bool:
    return plan is not None and plan.in_dtype == "float16" and plan.out_dtype in _TRITON_DTYPE and all(
        o.dtype in _TRITON_DTYPE for o in plan.operands)


def kernel_name(plan, config: TileConfig) -> str:
    digest = hashlib.sha1(repr((plan, config)).encode()).hexdigest()[:10]
    return f"tunekit_gemm_{digest}"


def kernel_source(plan, config: TileConfig, name: str) -> str:
    """Python source of the @triton.jit kernel: every shape and tile size a literal; pointers a, b, e<i>, out. With
    split-K the programs past the first M x N tiles take the next split: its K rows and its [M, N] of the output."""
    m, n, k = plan.m, plan.n, plan.k
    row = k * plan.splits  # A's row and B's column length
    bm, bn, bk, group = config.block_m, config.block_n, config.block_k, config.group_m
    grid_m, tiles = -(-m // bm), -(-m // bm) * -(-n // bn)
    in_group = group * -(-n // bn)  # tiles in a group of rows of tiles
    operands = [f"e{i}_ptr" for i in range(len(plan.operands))]
    if plan.b_transposed:
        b_tile = f"b + rn[None, :] * {row} + kk[:, None]"
    else:
        b_tile = f"b + kk[:, None] * {n} + rn[None, :]"
    k_mask = "" if k % bk == 0 else f" & (kk[None, :] < k_end)"
    k_mask_b = "" if k % bk == 0 else f" & (kk[:, None] < k_end)"
    lines = [
        "import triton",
        "import triton.language as tl",
        "",
        "",
        "@triton.jit",
        f"def {name}({', '.join(['a', 'b', *operands, 'out'])}):",
        f"    split = tl.program_id(0) // {tiles}",
        f"    pid = tl.program_id(0) % {tiles}",
        f"    first_m = (pid // {in_group}) * {group}",
        f"    size_m = tl.minimum({grid_m} - first_m, {group})",
        f"    pm = first_m + (pid % {in_group}) % size_m",
        f"    pn = (pid % {in_group}) // size_m",
        f"    rm = pm * {bm} + tl.arange(0, {bm})",
        f"    rn = pn * {bn} + tl.arange(0, {bn})",
        f"    rk = tl.arange(0, {bk})",
        f"    mask_m = rm < {m}",
        f"    mask_n = rn < {n}",
        f"    k_first = split * {k}",
        f"    k_end = k_first + {k}",
        f"    acc = tl.zeros(({bm}, {bn}), dtype=tl.float32)",
        f"    for k0 in range(0, {k}, {bk}):",
        "        kk = k_first + k0 + rk",
        f"        x = tl.load(a + rm[:, None] * {row} + kk[None, :], mask=mask_m[:, None]{k_mask}, other=0.0)",
        f"        y = tl.load({b_tile}, mask=mask_n[None, :]{k_mask_b}, other=0.0)",
        "        acc = tl.dot(x, y, acc)",
    ]
    for i, operand in enumerate(plan.operands):
        if operand.indexed_by == "n":
            lines.append(f"    e{i} = tl.load(e{i}_ptr + rn, mask=mask_n, other=0.0)[None, :]")
        elif operand.indexed_by == "m":
            lines.append(f"    e{i} = tl.load(e{i}_ptr + rm, mask=mask_m, other=0.0)[:, None]")
        else:
            lines.append(f"    e{i} = tl.load(e{i}_ptr + rm[:, None] * {n} + rn[None, :], "
                         "mask=mask_m[:, None] & mask_n[None, :], other=0.0)")
    lines += [f"    {statement}" for statement in plan.epilogue]
    lines.append(f"    tl.store(out + split * {m * n} + rm[:, None] * {n} + rn[None, :], "
                 f"({plan.result}).to({_TRITON_DTYPE[plan.out_dtype]}), mask=mask_m[:, None] & mask_n[None, :])")
    return "\n".join(lines) + "\n"


def grid(plan, config: TileConfig) -> int:
    return -(-plan.m // config.block_m) * -(-plan.n // config.block_n) * plan.splits


def jit_function(plan, config: TileConfig, *, cache_dir: str | None = None):
    """The kernel as a @triton.jit function (what Triton's interpreter runs on a CPU)."""
    name = kernel_name(plan, config)
    return jit_function_of(name, kernel_source(plan, config, name), cache_dir=cache_dir)


def compile_gemm(plan, config: TileConfig, *, arch: int) -> CompiledKernel:
    """The kernel compiled for sm_<arch> (e.g. 90): Triton's own ptxas, no GPU needed."""
    name = kernel_name(plan, config)
    dtypes = [plan.in_dtype, plan.in_dtype, *[o.dtype for o in plan.operands], plan.out_dtype]
    return compile_source(name, kernel_source(plan, config, name), [_TRITON_POINTER[t] for t in dtypes],
                          warps=config.warps, stages=config.stages, arch=arch, grid=grid(plan, config))


def launching_func(func, plan, kernel: CompiledKernel):
    """`func` (the task's PrimFunc) with a body that launches `kernel` on its parameters' data."""
    params = list(func.params)
    pointers = [params[plan.a].data, params[plan.b].data, *[params[o.param].data for o in plan.operands],
                params[plan.out].data]
    return launching_call(func, pointers, kernel, kind=KIND)
