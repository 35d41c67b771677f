"""A task's candidates of another kind than MetaSchedule's, whatever the task: a GEMM's Triton tiles
(kernels.triton_gemm) or a fused attention's Triton flash kernels (kernels.triton_attention). A fused attention,
which is never searched, is also measured as it is (HANDWRITTEN), so its Triton kernel must beat it to be chosen.
Configurations are named by their kind's own names; the name says which kind it is."""
from __future__ import annotations

import os

KIND = "triton"
HANDWRITTEN = "handwritten"  # the fused attention's own kernel (frontend.attention_kernel), measured as a baseline
# A report row's kernel that is the task's own: MetaSchedule's record, the untuned (default) kernel, the hand-written one
OWN_KINDS = (None, "metaschedule", "default", HANDWRITTEN)


def other_kind(kind) -> bool:
    """A report row's `kernel` is of another kind than the task's own (a Triton kernel)."""
    return kind not in OWN_KINDS


def configs_of(func) -> list[str]:
    """The configuration names worth measuring for the task `func`; [] for a task with none."""
    from . import triton_attention, triton_gemm
    from .gemm_plan import plan_of

    spec = triton_attention.spec_of(func)
    if spec is not None:
        return [c.name for c in triton_attention.configs(spec)] if triton_attention.supports(spec) else []
    plan = plan_of(func)
    return [c.name for c in triton_gemm.tile_configs(plan)] if triton_gemm.supports(plan) else []


def needs_baseline(func) -> bool:
    """A task whose own kernel is scheduled already (no untuned measurement of the search's)."""
    from . import triton_attention

    return triton_attention.spec_of(func) is not None


def compile_kernel(func, config_name: str, *, arch: int):
    """(the kernel of `config_name` for the task `func`, compiled for sm_<arch>, no GPU needed; its launching
    PrimFunc)."""
    from . import triton_attention, triton_gemm
    from .gemm_plan import plan_of

    if config_name.startswith("attn_"):
        spec = triton_attention.spec_of(func)
        if not triton_attention.supports(spec):
            raise ValueError("the task is no fused attention Triton can compute")
        kernel = triton_attention.compile_attention(spec, triton_attention.AttentionConfig.from_name(config_name),
                                                    arch=arch)
        return kernel, triton_attention.launching_func(func, kernel)
    plan = plan_of(func)
    if not triton_gemm.supports(plan):
        raise ValueError("the task has no Triton GEMM plan")
    kernel = triton_gemm.compile_gemm(plan, triton_gemm.TileConfig.from_name(config_name), arch=arch)
    return kernel, triton_gemm.launching_func(func, plan, kernel)


def compiled_launch(func, config_name: str, *, arch: int):
    """(launching PrimFunc, device module) of `func` as the Triton kernel of `config_name` (needs TVM's CUDA
    runtime)."""
    from .triton_compile import device_module

    kernel, launching = compile_kernel(func, config_name, arch=arch)
    return launching, device_module(kernel)


def build_candidate(func, reference, config_name: str, target, artifact_dir: str) -> str:
    """In a build worker: the task `func` as the kernel of `config_name`, exported to a shared library in
    `artifact_dir` whose `main` launches it, beside `reference` (the task's own kernel, scheduled) under the name the
    runner checks a candidate against (clients.session_runner.REFERENCE). HANDWRITTEN: `func` itself, alone.
    Returns the library's path."""
    import tempfile

    import tvm
    from tvm.driver import build as tvm_build

    from ..clients.session_runner import REFERENCE, mark_written_args
    from .triton_compile import arch_of

    if config_name == HANDWRITTEN:
        lib = tvm_build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
    else:
        launching, device = compiled_launch(func, config_name, arch=arch_of(target))
        lib = tvm_build(tvm.IRModule({"main": launching.with_attr("global_symbol", "main"),
                                      REFERENCE: reference.with_attr("global_symbol", REFERENCE)}), target=target)
        lib.import_module(device)
    fd, path = tempfile.mkstemp(prefix=f"{KIND}-", suffix=".so", dir=artifact_dir)
    os.close(fd)
    lib.export_library(path)
    if config_name != HANDWRITTEN:
        mark_written_args(path, [len(func.params) - 1])  # a GEMM plan's or an attention's one output: the last
    return path


def with_kernels(mod, choices: dict[str, str], *, target):
    """`mod` (a prepared module) with the tasks of `choices` ({workload key: configuration name}) computed by their
    Triton kernels, compiled for `target`. Returns (module, the keys replaced)."""
    from .in_module import replace_tasks
    from .triton_compile import arch_of

    def replacement(key: str, func):
        return compiled_launch(func, choices[key], arch=arch_of(target)) if key in choices else None

    return replace_tasks(mod, replacement)
