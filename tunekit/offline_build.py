"""The untuned build of a prepared model for a GPU target, on a machine without that GPU (`tunekit check`).

The build itself is a tune's own (clients.compiler.compile_and_export). Where no GPU is present TVM keeps each
CUDA module as source (its CUDA runtime, which would compile it, is not loaded), so a build passes whether or
not its kernels compile. The sources are therefore taken as the build emits them and compiled here with NVRTC,
through the callback a tune compiles its kernels with (clients.cuda_compile), which needs no GPU either.
"""
from __future__ import annotations

import contextlib
import os
import tempfile

from .errors import error_line

_POSTPROC = "tvm_callback_cuda_postproc"  # TVM calls it with every CUDA module's source before compiling it


def nvrtc_unavailable() -> str | None:
    """None when this process can compile CUDA with NVRTC (cuda-bindings, libnvrtc, the CUDA headers), else
    why not, in one line."""
    try:
        from cuda.bindings import nvrtc

        nvrtc.nvrtcVersion()  # loads libnvrtc: the bindings import without it
    except Exception as exc:
        text = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:120]
        return f"NVRTC is not available here ({text}); install tunekit[gpu] and NVRTC"
    from tvm.support.nvcc import find_cuda_path

    try:
        root = find_cuda_path()
    except Exception:
        return "no CUDA toolkit found for NVRTC's headers (set CUDA_PATH)"
    if not os.path.isfile(os.path.join(root, "include", "cuda_fp16.h")):
        # `which nvcc` can point at a wrapper outside the toolkit: the usual place, if it is there
        if not os.path.isfile("/usr/local/cuda/include/cuda_fp16.h"):
            return f"no CUDA headers under {root} (set CUDA_PATH to the CUDA toolkit)"
        os.environ["CUDA_PATH"] = "/usr/local/cuda"
    return None


@contextlib.contextmanager
def _captured_cuda_sources():
    """Yields the list the build's CUDA module sources are appended to, while the build runs."""
    import tvm_ffi

    previous = tvm_ffi.get_global_func(_POSTPROC, allow_missing=True)
    sources: list[str] = []

    def keep(code, *args):
        code = previous(code, *args) if previous is not None else code
        sources.append(str(code))
        return code

    tvm_ffi.register_global_func(_POSTPROC, keep, override=True)
    try:
        yield sources
    finally:  # this process's builds after the check must not keep feeding the list
        if previous is None:
            tvm_ffi.remove_global_func(_POSTPROC)
        else:
            tvm_ffi.register_global_func(_POSTPROC, previous, override=True)


def _nvrtc_error(exc: Exception) -> str:
    """NVRTC's first `error:` line (its log names the kernel file and line), else the error's own line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return next((line for line in lines if "error" in line.lower() and "(" in line), error_line(str(exc)))[:200]


def _compile_kernels(sources: list[str], target) -> tuple[str, str]:
    import tvm_ffi

    from .clients.cuda_compile import install

    install()  # compile_and_export installed it already; idempotent
    compile_cuda = tvm_ffi.get_global_func("tvm_callback_cuda_compile")
    with target:  # NVRTC takes the architecture from the current target, as in a tune's build
        for code in sources:
            try:
                compile_cuda(code)
            except Exception as exc:
                return "failed", f"NVRTC: {_nvrtc_error(exc)}"
    return "ok", f"{len(sources)} CUDA module(s) compiled by NVRTC for {target.arch}"


def untuned_build(prepared, target) -> tuple[str, str]:
    """("ok" | "failed" | "skipped", one line): `prepared` built for `target` as a tune builds its untuned model,
    then, for a CUDA target, its kernels compiled by NVRTC ("skipped" when NVRTC is not available here)."""
    from .clients.compiler import compile_and_export

    with tempfile.TemporaryDirectory(prefix="tunekit-check-") as tmp, _captured_cuda_sources() as sources:
        try:
            compile_and_export(prepared_mod=prepared, target=target, database=None,
                               path=os.path.join(tmp, "untuned.so"))
        except Exception as exc:
            return "failed", error_line(str(exc))
    if target.kind.name != "cuda":
        return "ok", "built"
    missing = nvrtc_unavailable()
    if missing is not None:
        return "skipped", f"built as CUDA source, kernels not compiled: {missing}"
    return _compile_kernels(sources, target)
