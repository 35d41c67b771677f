"""Relax module -> MetaSchedule tuning tasks for a target."""
from __future__ import annotations

from ..errors import TunekitError


def prepare_for_tuning(mod, target, *, fold_kernels: bool = True):
    """The passes extract_tasks needs: without them it silently returns no tasks. Records apply to
    the module this returns. (frontend.precision.prepare converts the precision first.)

    A kernel that only reshapes becomes a view here, as the build would make it anyway: so it is
    not a task (the fused attention's [B, S, H, D] output read as [B, S, H * D] was one, weight 12
    in BERT-base, that the scheduler would have spent trials on).

    The kernels are cut by frontend.fusion (Relax's "zero" pipeline, with fewer launches on GPUs;
    `fold_kernels=False` keeps the zero pipeline's cut, for comparisons)."""
    from tvm import relax

    from .fusion import fuse_kernels

    with target:
        mod = relax.transform.DecomposeOpsForInference()(mod)
        mod = relax.transform.CanonicalizeBindings()(mod)
        mod = fuse_kernels(mod, gpu=fold_kernels and target.kind.name == "cuda")
        mod = relax.transform.RewriteDataflowReshape()(mod)
    return mod


def extract_tasks(prepared_mod, target):
    from tvm.s_tir import meta_schedule as ms

    tasks = ms.relax_integration.extract_tasks(prepared_mod, target)
    if not tasks:
        raise TunekitError("the model produced no tuning tasks")
    return tasks


def already_scheduled(task) -> bool:
    """A task whose kernel is scheduled already (hand-written, like frontend.attention_kernel's): it
    is built as it is and never searched. Extraction lists such tasks too, and marks the PrimFunc,
    not the module, so the module's attrs alone miss it (the search then crashed on a kernel with
    no blocks: "Cannot treat type tirx.SeqStmt as type s_tir.SBlockRealize")."""
    if task.mod.attrs and task.mod.attrs.get("tirx.is_scheduled", False):
        return True
    return any(func.attrs and func.attrs.get("tirx.is_scheduled", False) for func in task.mod.functions.values())


def task_flops(mod) -> float:
    """Floating-point operations of one call of a task's kernel (TVM's estimate); 1.0 when the
    estimator does not know an op (cheap, not an error)."""
    from tvm.s_tir.analysis import estimate_tir_flops

    try:
        return float(estimate_tir_flops(mod))
    except Exception:
        return 1.0


def task_bytes(mod) -> int:
    """Bytes of a task's kernel's parameters (its inputs and outputs): what one call must move at least; 0 when a
    shape is not a number (symbolic)."""
    import math

    from tvm import tirx

    try:
        return sum(math.prod(int(d) for d in buf.shape) * _dtype_bytes(str(buf.dtype))
                   for func in mod.functions.values() if isinstance(func, tirx.PrimFunc)
                   for buf in func.params)  # TVM 0.27: a PrimFunc's params are its buffers
    except (TypeError, ValueError, AttributeError):
        return 0


def _dtype_bytes(dtype: str) -> int:
    import tvm

    dt = tvm.DataType(dtype)
    return max(1, dt.bits * dt.lanes // 8)


def task_family(name: str) -> str:
    """The operator a task is about, from its name: "fused_conv2d1_add1_relu1" -> "conv2d". Tasks of one
    family are "similar" to the scheduler (their FLOP rates are comparable)."""
    parts = [p for p in name.split("_") if p and p != "fused"]
    head = parts[0] if parts else name
    return head.rstrip("0123456789") or head
