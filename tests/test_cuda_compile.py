"""The lean NVRTC compile (clients/cuda_compile.py) gives the kernels TVM's own NVRTC path gives.

NVRTC needs no GPU: `make test` puts cuda-bindings and NVRTC into .nvrtcsite (not the venv, where
they would make a CPU machine look ready for --gpu-pct), and the CUDA sources come from compiling
real models for an sm_90a target on this CPU. Skipped where NVRTC or the CUDA headers are missing.
"""
import os
import re

import pytest

from tunekit.testing.kernels import nvrtc_unavailable

pytestmark = pytest.mark.skipif(nvrtc_unavailable() is not None, reason=str(nvrtc_unavailable()))

# libcu++'s static constexpr members: TVM's path emits them as unused device globals, the stand-ins
# do not declare them. Everything else in the PTX must match.
_LIBCUXX_GLOBAL = re.compile(r"^\.global .*_ZN4cuda3std")


def _kernel_ptx(ptx: bytes) -> str:
    return "\n".join(line for line in bytes(ptx).decode().splitlines() if not _LIBCUXX_GLOBAL.match(line))


def _cuda_sources(example: str, precision: str, tmp_path) -> str:
    """The CUDA source of a whole example model compiled (untuned, DLight) for an H100 on this CPU."""
    import tvm

    from tunekit.frontend.onnx_loader import import_to_relax, load_onnx, model_inputs
    from tunekit.frontend.precision import prepare
    from tunekit.models.examples import save_example
    from tunekit.testing.kernels import cuda_source

    model = load_onnx(save_example(example, str(tmp_path / f"{example}.onnx")))
    target = tvm.target.Target("nvidia/nvidia-h100")
    prepared, _ = prepare(import_to_relax(model, model_inputs(model, {})), target, precision=precision)
    return cuda_source(prepared, target)


# What TVM's preambles take from libcu++, used the way generated code (reductions' -INFINITY
# identities, 64-bit index math, fp16 helper templates) uses it; appended to a real module's source.
_PREAMBLE_FEATURES = """
extern "C" __global__ void tk_features(float* f, int64_t* i, uint8_t* u) {
  f[0] = -INFINITY;
  f[1] = max(f[2], INFINITY);
  i[0] = ((int64_t)f[3]) * ((int64_t)threadIdx.x) + INT32_MAX;
  u[0] = (uint8_t)(i[1] >> 3);
  f[4] = std::is_same_v<half, __half> ? f[5] : f[6];
  f[7] = std::is_integral<int64_t>::value + std::is_signed<uint32_t>::value + std::is_floating_point<float>::value;
}
"""


@pytest.mark.parametrize("example,precision,extra", [("tiny_cnn", "fp16", ""), ("tiny_cnn", "fp32", ""),
                                                     ("transformer", "fp16", ""),
                                                     ("tiny_cnn", "fp16", _PREAMBLE_FEATURES)])
@pytest.mark.e2e
def test_lean_compile_gives_tvms_kernels(example, precision, extra, tmp_path):
    from tvm.support import nvcc

    from tunekit.clients.cuda_compile import compile_lean

    code = _cuda_sources(example, precision, tmp_path) + extra
    theirs = nvcc.compile_cuda(code, target_format="ptx", arch="compute_90a", compiler="nvrtc")
    ours = compile_lean(code, arch="compute_90a", cuda_path=nvcc.find_cuda_path(), target_format="ptx")
    assert ".entry" in _kernel_ptx(ours)
    assert _kernel_ptx(ours) == _kernel_ptx(theirs)


def test_installed_callback_compiles_lean_and_falls_back_to_tvm():
    import tvm
    import tvm_ffi

    from tunekit.clients import cuda_compile

    cuda_compile.install()
    compile_cuda = tvm_ffi.get_global_func("tvm_callback_cuda_compile")
    plain = 'extern "C" __global__ void k(float* a) { a[0] = INFINITY; }\n'
    # more of libcu++ than the stand-ins declare: TVM's own path has to compile it
    wider = ('#include <cuda/std/limits>\nextern "C" __global__ void k(int* a) '
             '{ a[0] = cuda::std::numeric_limits<int>::max(); }\n')
    before = cuda_compile.stats()
    with tvm.target.Target("nvidia/nvidia-h100"):
        assert len(bytes(compile_cuda(plain))) > 0
        middle = cuda_compile.stats()
        assert len(bytes(compile_cuda(wider))) > 0
    after = cuda_compile.stats()
    assert (middle["lean"] - before["lean"], middle["fallback"] - before["fallback"]) == (1, 0)
    assert (after["lean"] - middle["lean"], after["fallback"] - middle["fallback"]) == (0, 1)


def test_installed_callback_reuses_the_cubin_of_the_same_source(monkeypatch):
    """The tuned GPU model is compiled twice (with and without CUDA graphs: the device code is the
    same): the second compile takes the first's cubin, unless TVM's NVRTC knobs changed between them."""
    import tvm
    import tvm_ffi

    from tunekit.clients import cuda_compile

    cuda_compile.install()
    compile_cuda = tvm_ffi.get_global_func("tvm_callback_cuda_compile")
    code = f'extern "C" __global__ void k(float* a) {{ a[0] = {os.getpid()}.5f; }}\n'  # new to this process
    with tvm.target.Target("nvidia/nvidia-h100"):
        before = cuda_compile.stats()
        first = bytes(compile_cuda(code))
        middle = cuda_compile.stats()
        again = bytes(compile_cuda(code))
        after = cuda_compile.stats()
        monkeypatch.setenv("TVM_CUDA_NVRTC_EXTRA_OPTS", "-lineinfo")
        compile_cuda(code)
        knobs = cuda_compile.stats()
    assert (middle["lean"] - before["lean"], middle["reused"] - before["reused"]) == (1, 0)
    assert (after["lean"] - middle["lean"], after["reused"] - middle["reused"]) == (0, 1)
    assert again == first
    assert (knobs["lean"] - after["lean"], knobs["reused"] - after["reused"]) == (1, 0)
