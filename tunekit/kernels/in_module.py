"""Put kernels of another kind into a prepared Relax module: each replaces the PrimFunc of its task's workload
(matched as MetaSchedule matches a record: the function as the task's `main`), and its device module goes into the
IRModule's `external_mods`, which the Relax build links into the artifact."""
from __future__ import annotations


def task_key(func) -> str:
    """The workload key (records.baselines.workload_key) of a module's PrimFunc, as its task has it."""
    import tvm

    from ..records.baselines import workload_key

    return workload_key(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}))


def replace_tasks(mod, replacement):
    """`mod` with the PrimFuncs for which `replacement(task_key, func)` gives (launching PrimFunc, device module)
    replaced (None: kept). Returns (module, the keys replaced)."""
    import tvm

    replaced, external = set(), list(mod.attrs["external_mods"]) if mod.attrs and "external_mods" in mod.attrs else []
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, tvm.tirx.PrimFunc):
            continue
        key = task_key(func)
        made = replacement(key, func)
        if made is not None:
            launching, device_module = made
            updates[gv] = launching.with_attr("global_symbol", gv.name_hint)
            external.append(device_module)
            replaced.add(key)
    if not updates:
        return mod, replaced
    out = mod.clone()  # update_func changes the module it is called on
    for gv, func in updates.items():
        out.update_func(gv, func)
    return out.with_attr("external_mods", external), replaced
