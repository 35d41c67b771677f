"""A Triton kernel's source compiled for a CUDA architecture without a GPU (Triton brings its own ptxas), the TVM
CUDA module that holds its cubin, and the PrimFunc body that launches it. kernels.triton_gemm and
kernels.triton_attention write the sources.

The launching PrimFunc keeps the task's parameters and calls the kernel with `call_packed`; the kernel's module goes
into the IRModule's `external_mods`, which the Relax build links into the artifact (TVM's own route for
`T.call_kernel`, python/tvm/tirx/script/builder/external_kernel.py).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import tempfile


@dataclasses.dataclass(frozen=True)
class CompiledKernel:
    name: str
    cubin: bytes
    threads: int
    shared_bytes: int
    grid: int
    params: int       # the kernel's parameters in its PTX (Triton >= 3.3 adds scratch pointers after ours)
    pointers: int     # ours


def jit_function(name: str, source: str, *, cache_dir: str | None = None):
    """The kernel `name` of `source` as a @triton.jit function, from a module file of its own (Triton reads a
    kernel's source)."""
    folder = cache_dir or os.path.join(tempfile.gettempdir(), "tunekit-triton-src")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name}.py")
    if not os.path.isfile(path) or open(path).read() != source:
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as fh:
            fh.write(source)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def compile_source(name: str, source: str, pointers: list[str], *, warps: int, stages: int, arch: int,
                   grid: int) -> CompiledKernel:
    """Kernel `name` of `source`, whose parameters are all pointers (Triton types: *fp16, ...), for sm_<arch>."""
    import triton
    from triton.backends.compiler import GPUTarget

    fn = jit_function(name, source)
    signature = dict(zip(fn.arg_names, pointers))
    # TVM's allocations are 64-byte aligned: say so, so Triton vectorizes its loads and stores
    attrs = {(i,): [["tt.divisibility", 16]] for i in range(len(signature))}
    compiled = triton.compiler.compile(triton.compiler.ASTSource(fn=fn, signature=signature, attrs=attrs),
                                       target=GPUTarget("cuda", arch, 32),
                                       options={"num_warps": warps, "num_stages": stages})
    if compiled.metadata.num_ctas != 1:
        raise ValueError("a Triton kernel of more than one CTA per cluster cannot be called from TVM")
    return CompiledKernel(name=compiled.name, cubin=bytes(compiled.asm["cubin"]),
                          threads=compiled.metadata.num_warps * 32, shared_bytes=int(compiled.metadata.shared),
                          grid=grid, params=_ptx_params(compiled.asm["ptx"], compiled.name), pointers=len(signature))


def _ptx_params(ptx: str, name: str) -> int:
    found = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if found is None:
        raise ValueError(f"kernel {name} not found in its PTX")
    return len(re.findall(r"\.param\s", found.group(1)))


def device_module(kernel: CompiledKernel):
    """A TVM CUDA module holding the kernel's cubin, its launch read from the call's last arguments."""
    import tvm
    import tvm_ffi

    arg_types = ["handle"] * kernel.pointers + ["int64"] * (kernel.params - kernel.pointers)
    tags = ["threadIdx.x", "blockIdx.x"] + (["tirx.use_dyn_shared_memory"] if kernel.shared_bytes else [])
    metadata = json.dumps({"tvm_version": tvm.__version__, "func_info": {
        kernel.name: {"name": "", "arg_types": arg_types, "launch_param_tags": tags}}})
    functions = tvm_ffi.get_global_func("runtime.LoadMetaDataFromJSON")(metadata)
    return tvm_ffi.get_global_func("ffi.Module.create.cuda")(kernel.cubin, "cubin", functions, {})


def launching_call(func, pointers: list, kernel: CompiledKernel, *, kind: str):
    """`func` with a body that launches `kernel` on `pointers` (its parameters' data, in the kernel's order)."""
    import tvm
    from tvm import tirx

    scratch = [tvm.tirx.IntImm("int64", 0)] * (kernel.params - kernel.pointers)  # Triton's unused scratch
    launch = [kernel.threads, kernel.grid] + ([kernel.shared_bytes] if kernel.shared_bytes else [])
    call = tirx.call_packed(kernel.name, *pointers, *scratch, *[tvm.tirx.IntImm("int32", x) for x in launch])
    # op_pattern 8 (kOpaque): the Relax build's FuseOps must not fuse a call to it with its neighbours (FuseTIR takes
    # only functions whose body is a block)
    return func.with_body(tirx.Evaluate(call)).with_attrs({"tirx.is_scheduled": True, "tunekit.kernel": kind,
                                                           "op_pattern": 8})


def config_from_name(cls, pattern: str, name: str, what: str):
    """A tile configuration dataclass `cls` from its name: `pattern`'s groups, in order, are its int fields."""
    found = re.fullmatch(pattern, name)
    if found is None:
        raise ValueError(f"not a Triton {what}: {name!r}")
    return cls(*(int(x) for x in found.groups()))


def ceil_pow2(x: int) -> int:
    """The power of two at or above x: Triton's block shapes."""
    return 1 << max(0, (x - 1).bit_length())


def arch_of(target) -> int:
    """The compute capability of a CUDA target as Triton takes it (sm_90 -> 90)."""
    arch = str(target.attrs.get("arch", ""))
    found = re.fullmatch(r"sm_(\d+)a?", arch)
    if found is None:
        raise ValueError(f"not a CUDA target with an sm_ architecture: {target}")
    return int(found.group(1))
