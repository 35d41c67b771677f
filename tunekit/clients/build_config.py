"""The PassContext configs a candidate (and a tuned model) is built with, in the order tried.

TVM 0.27's StorageRewrite lets an fp32 accumulator reuse an fp16 shared buffer of a WMMA
(tensor-core) kernel, and the stricter access_ptr check then refuses the build ("tvm_access_ptr
element type must match the source buffer"): 45 of 64 tensor-core candidates failed so. Without
the rewrite all 64 built. Candidates whose TIR calls tensor-core intrinsics are built without it
first; any CUDA candidate whose first build fails is built once more the other way.
"""
from __future__ import annotations

NO_STORAGE_REWRITE = {"tirx.disable_storage_rewrite": True}
_TENSOR_CORE_CALLS = ("tvm_mma_sync", "tvm_load_matrix_sync", "ptx_mma", "ptx_ldmatrix")


def uses_tensor_cores(script: str) -> bool:
    """Whether a scheduled module's TVMScript calls tensor-core intrinsics (WMMA or mma)."""
    return any(call in script for call in _TENSOR_CORE_CALLS)


def build_configs(target, *, tensor_core: bool) -> list[dict]:
    """Configs to try in order: CPU just the default; a tensor-core kernel without the storage rewrite
    first; any other CUDA kernel the default first."""
    if target.kind.name != "cuda":
        return [{}]
    return [NO_STORAGE_REWRITE, {}] if tensor_core else [{}, NO_STORAGE_REWRITE]
