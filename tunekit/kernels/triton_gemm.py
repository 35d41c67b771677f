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
import importlib.util
import json
import os
import re
import tempfile

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
        found = re.fullmatch(r"m(\d+)n(\d+)k(\d+)w(\d+)s(\d+)g(\d+)", name)
        if found is None:
            raise ValueError(f"not a Triton tile configuration: {name!r}")
        return cls(*(int(x) for x in found.groups()))


# Triton's matmul tutorial's configurations for Hopper and Ampere, smaller-M ones for a batch of a few rows, and
# deeper K steps for the short reductions of batch-1 transformers (K = 768: 12 steps of 64, 6 of 128)
_CONFIGS = [TileConfig(128, 256, 64, 8, 3), TileConfig(64, 256, 32, 4, 4), TileConfig(128, 128, 32, 4, 4),
            TileConfig(128, 64, 32, 4, 4), TileConfig(64, 128, 32, 4, 4), TileConfig(128, 32, 32, 4, 4),
            TileConfig(64, 32, 32, 2, 5), TileConfig(32, 64, 32, 2, 5), TileConfig(64, 64, 64, 4, 3),
            TileConfig(32, 128, 64, 4, 3), TileConfig(16, 128, 64, 4, 3), TileConfig(16, 64, 64, 4, 4),
            TileConfig(64, 128, 64, 4, 3), TileConfig(128, 128, 64, 8, 3), TileConfig(128, 64, 64, 4, 3),
            TileConfig(64, 64, 128, 4, 3)]


def tile_configs(plan) -> list[TileConfig]:
    """The candidates worth measuring for `plan`: no tile larger than the problem needs (tl.dot takes 16 and up)."""
    return [c for c in _CONFIGS if c.block_m <= max(16, _ceil_pow2(plan.m)) and c.block_n <= max(32, _ceil_pow2(plan.n))
            and c.block_k <= max(32, _ceil_pow2(plan.k))]


def _ceil_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


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
    """The kernel as a @triton.jit function, from a module file of its own (Triton reads a kernel's source)."""
    name = kernel_name(plan, config)
    folder = cache_dir or os.path.join(tempfile.gettempdir(), "tunekit-triton-src")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.py")
    source = kernel_source(plan, config, name)
    if not os.path.isfile(path) or open(path).read() != source:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            fh.write(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


@dataclasses.dataclass(frozen=True)
class CompiledGemm:
    name: str
    cubin: bytes
    threads: int
    shared_bytes: int
    grid: int
    params: int       # the kernel's parameters in its PTX (Triton >= 3.3 adds scratch pointers after ours)
    pointers: int     # ours: a, b, the epilogue's operands, out


def compile_gemm(plan, config: TileConfig, *, arch: int) -> CompiledGemm:
    """The kernel compiled for sm_<arch> (e.g. 90): Triton's own ptxas, no GPU needed."""
    import triton
    from triton.backends.compiler import GPUTarget

    fn = jit_function(plan, config)
    dtypes = [plan.in_dtype, plan.in_dtype, *[o.dtype for o in plan.operands], plan.out_dtype]
    signature = {arg: _TRITON_POINTER[dtype] for arg, dtype in zip(fn.arg_names, dtypes)}
    # TVM's allocations are 64-byte aligned: say so, so Triton vectorizes its loads and stores
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(signature))}
    source = triton.compiler.ASTSource(fn=fn, signature=signature, attrs=attrs)
    compiled = triton.compiler.compile(source, target=GPUTarget("cuda", arch, 32),
                                       options={"num_warps": config.warps, "num_stages": config.stages})
    if compiled.metadata.num_ctas != 1:
        raise ValueError("a Triton kernel of more than one CTA per cluster cannot be called from TVM")
    params = _ptx_params(compiled.asm["ptx"], compiled.name)
    return CompiledGemm(name=compiled.name, cubin=bytes(compiled.asm["cubin"]),
                        threads=compiled.metadata.num_warps * 32, shared_bytes=int(compiled.metadata.shared),
                        grid=grid(plan, config), params=params, pointers=len(signature))


def _ptx_params(ptx: str, name: str) -> int:
    found = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if found is None:
        raise ValueError(f"kernel {name} not found in its PTX")
    return len(re.findall(r"\.param\s", found.group(1)))


def device_module(kernel: CompiledGemm):
    """A TVM CUDA module holding the kernel's cubin, its launch read from the call's last arguments."""
    import tvm_ffi

    arg_types = ["handle"] * kernel.pointers + ["int64"] * (kernel.params - kernel.pointers)
    tags = ["threadIdx.x", "blockIdx.x"] + (["tirx.use_dyn_shared_memory"] if kernel.shared_bytes else [])
    metadata = json.dumps({"tvm_version": _tvm_version(), "func_info": {
        kernel.name: {"name": "", "arg_types": arg_types, "launch_param_tags": tags}}})
    functions = tvm_ffi.get_global_func("runtime.LoadMetaDataFromJSON")(metadata)
    return tvm_ffi.get_global_func("ffi.Module.create.cuda")(kernel.cubin, "cubin", functions, {})


def _tvm_version() -> str:
    import tvm

    return tvm.__version__


def launching_func(func, plan, kernel: CompiledGemm):
    """`func` (the task's PrimFunc) with a body that launches `kernel` on its parameters' data."""
    import tvm
    from tvm import tirx

    params = list(func.params)
    pointers = [params[plan.a].data, params[plan.b].data, *[params[o.param].data for o in plan.operands],
                params[plan.out].data]
    scratch = [tvm.tirx.IntImm("int64", 0)] * (kernel.params - kernel.pointers)  # Triton's unused scratch
    launch = [kernel.threads, kernel.grid] + ([kernel.shared_bytes] if kernel.shared_bytes else [])
    call = tirx.call_packed(kernel.name, *pointers, *scratch, *[tvm.tirx.IntImm("int32", x) for x in launch])
    # op_pattern 8 (kOpaque): the Relax build's FuseOps must not fuse a call to it with its neighbours (FuseTIR takes
    # only functions whose body is a block)
    return func.with_body(tirx.Evaluate(call)).with_attrs({"tirx.is_scheduled": True, "tunekit.kernel": KIND,
                                                           "op_pattern": 8})


def build_candidate(func, reference, config_name: str, target, artifact_dir: str) -> str:
    """In a build worker: the task `func` as the Triton kernel of `config_name`, exported to a shared library in
    `artifact_dir` whose `main` launches it, beside `reference` (the task's own kernel, scheduled) under the name the
    runner checks a candidate against (clients.session_runner.REFERENCE). Returns the library's path."""
    import tempfile

    import tvm
    from tvm.driver import build as tvm_build

    from ..clients.session_runner import REFERENCE
    from .gemm_plan import plan_of

    plan = plan_of(func)
    if not supports(plan):
        raise ValueError("the task has no Triton GEMM plan")
    kernel = compile_gemm(plan, TileConfig.from_name(config_name), arch=arch_of(target))
    mod = tvm.IRModule({"main": launching_func(func, plan, kernel).with_attr("global_symbol", "main"),
                        REFERENCE: reference.with_attr("global_symbol", REFERENCE)})
    lib = tvm_build(mod, target=target)
    lib.import_module(device_module(kernel))
    fd, path = tempfile.mkstemp(prefix=f"{KIND}-", suffix=".so", dir=artifact_dir)
    os.close(fd)
    lib.export_library(path)
    return path


def arch_of(target) -> int:
    """The compute capability of a CUDA target as Triton takes it (sm_90 -> 90)."""
    arch = str(target.attrs.get("arch", ""))
    found = re.fullmatch(r"sm_(\d+)a?", arch)
    if found is None:
        raise ValueError(f"not a CUDA target with an sm_ architecture: {target}")
    return int(found.group(1))


def with_triton_kernels(mod, choices: dict, *, target):
    """`mod` (a prepared module) with the GEMM tasks of `choices` ({workload key: TileConfig}) computed by their
    Triton kernels, compiled for `target`. Returns (module, the keys replaced)."""
    from .gemm_plan import plan_of
    from .in_module import replace_tasks

    def replacement(key: str, func):
        if key not in choices:
            return None
        plan = plan_of(func)
        if not supports(plan):
            raise ValueError(f"task {key} has no Triton GEMM plan")
        kernel = compile_gemm(plan, choices[key], arch=arch_of(target))
        return launching_func(func, plan, kernel), device_module(kernel)

    return replace_tasks(mod, replacement)
