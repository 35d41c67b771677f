"""Small TVM kernels with a known behaviour on a runner server (each an IRModule with "main")."""
from __future__ import annotations


def add_one_module(n: int = 1024):
    """B = A + 1: builds and measures in milliseconds."""
    import tvm
    from tvm import te

    a = te.placeholder((n,), name="A")
    b = te.compute((n,), lambda i: a[i] + 1, name="B")
    return tvm.IRModule({"main": te.create_prim_func([a, b])})


def take_module(rows: int = 4, cols: int = 8, n: int = 256):
    """An embedding lookup: reads its table at the int64 index argument's values."""
    import tvm
    from tvm import te

    table = te.placeholder((rows, cols), name="table")
    index = te.placeholder((n,), dtype="int64", name="index")
    out = te.compute((n, cols), lambda i, j: table[index[i], j], name="out")
    return tvm.IRModule({"main": te.create_prim_func([table, index, out])})


def crash_module():
    """Calls abort(): the server process dies with the candidate (SIGABRT)."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def crash(a: T.Buffer((1,), "float32")):
        T.evaluate(T.call_extern("int32", "abort"))
        a[0] = T.float32(1)

    return tvm.IRModule({"main": crash})


def hang_module():
    """Never returns: the server must be stopped from outside."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def hang(a: T.Buffer((1,), "float32")):
        while T.float32(1) > T.float32(0):
            a[0] = a[0] + T.float32(1)

    return tvm.IRModule({"main": hang})


def slow_module():
    """A dependent chain of 10^9 steps: seconds per call, then returns."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def slow(a: T.Buffer((1,), "float32")):
        for _ in range(1000000000):
            a[0] = a[0] * T.float32(0.999999) + T.float32(1)

    return tvm.IRModule({"main": slow})


def checked_library(main_adds: float, reference_adds: float, written: list[int] | None,
                    artifact_dir: str) -> str:
    """A CPU candidate with its reference (clients.session_runner.REFERENCE): `main` computes B = A + main_adds and
    the reference B = A + reference_adds, exported to a library in `artifact_dir` (a build pool's submit_call);
    `written`: the arguments its check compares (session_runner.mark_written_args), else all."""
    import os
    import tempfile

    import tvm
    from tvm import te
    from tvm.driver import build

    from ..clients.session_runner import REFERENCE, mark_written_args

    def adds(value: float, name: str):
        a = te.placeholder((256,), name="A")
        b = te.compute((256,), lambda i: a[i] + value, name="B")
        return te.create_prim_func([a, b]).with_attr("global_symbol", name)

    lib = build(tvm.IRModule({"main": adds(main_adds, "main"), REFERENCE: adds(reference_adds, REFERENCE)}),
                target="llvm")
    fd, path = tempfile.mkstemp(suffix=".so", dir=artifact_dir)
    os.close(fd)
    lib.export_library(path)
    if written is not None:
        mark_written_args(path, written)
    return path


def pass_failure_module():
    """Fails inside a lowering pass (an fp32 pointer into an fp16 buffer: the check TVM 0.27 raised
    for a third of BERT-base's tensor-core candidates before storage-rewrite was turned off)."""
    import tvm
    from tvm.script import tirx as T

    @T.prim_func
    def mismatched(a: T.Buffer((64,), "float16")):
        T.evaluate(T.call_extern("int32", "consume", T.tvm_access_ptr(T.type_annotation("float32"), a.data, 0, 64, 1)))

    return tvm.IRModule({"main": mismatched})


def cuda_source(mod, target) -> str:
    """The CUDA source TVM emits for `mod` on `target`; on a machine without CUDA the module stays source."""
    import tvm

    with target:
        executable = tvm.compile(mod, target=target)

    def modules(m):
        yield m
        for sub in m.imports:
            yield from modules(sub)

    sources = [m.inspect_source() for m in modules(executable.mod) if m.kind == "cuda"]
    assert sources, "no CUDA module in the build"
    return "\n".join(sources)


def nvrtc_unavailable() -> str | None:
    """None when NVRTC and the CUDA headers can be used from this process, else why not. `make test` puts NVRTC
    into .nvrtcsite beside the checkout's tests (not the venv, where it would make a CPU machine look ready for
    --gpu-pct)."""
    import ctypes
    import glob
    import os
    import sys

    site = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ".nvrtcsite")
    if os.path.isdir(site) and site not in sys.path:
        sys.path.append(site)
        for lib in glob.glob(os.path.join(site, "nvidia", "cu*", "lib", "libnvrtc.so.*")):
            if "builtins" not in lib:  # cuda-bindings looks in site-packages or the system only
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
    try:
        from cuda.bindings import nvrtc
        from tvm.support.nvcc import find_cuda_path

        nvrtc.nvrtcVersion()
        if not os.path.isfile(os.path.join(find_cuda_path(), "include", "cuda_runtime.h")):
            if not os.path.isfile("/usr/local/cuda/include/cuda_runtime.h"):
                return "no CUDA headers"
            os.environ["CUDA_PATH"] = "/usr/local/cuda"
    except Exception as exc:  # ImportError, a missing libnvrtc, no CUDA toolkit
        return f"NVRTC unavailable: {str(exc).splitlines()[0][:120]}"
    return None


def nvrtc_ptx(code: str) -> str:
    """The PTX NVRTC makes of CUDA source `code` for sm_90a (call nvrtc_unavailable() first)."""
    from tvm.support import nvcc

    from ..clients.cuda_compile import compile_lean

    return bytes(compile_lean(code, arch="compute_90a", cuda_path=nvcc.find_cuda_path(), target_format="ptx")).decode()
