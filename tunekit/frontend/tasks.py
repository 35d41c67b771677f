"""Relax module -> MetaSchedule tuning tasks for a target."""
from __future__ import annotations

from ..errors import TunekitError


def prepare_for_tuning(mod, target):
    """The passes extract_tasks needs: without them it silently returns no tasks."""
    from tvm import relax

    with target:
        mod = relax.transform.DecomposeOpsForInference()(mod)
        mod = relax.transform.CanonicalizeBindings()(mod)
        mod = relax.get_pipeline("zero")(mod)
    return mod


def extract_tasks(prepared_mod, target):
    from tvm.s_tir import meta_schedule as ms

    tasks = ms.relax_integration.extract_tasks(prepared_mod, target)
    if not tasks:
        raise TunekitError("the model produced no tuning tasks")
    return tasks
