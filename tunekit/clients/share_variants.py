"""One Relax module holding several variants of a model, for the share-robust artifact.

Each variant is the model with one share's records applied. In the merged module every function of
the variant for share S is renamed `<name>__S` (its `main` becomes `main__S`, the entry that
tunekit.deploy.variants calls), and `main` is the default variant's `main` again. Kernels that are
the same in two variants are kept once (BlockBuilder.add_func reuses a structurally equal
function), and the weights once: the variants' Relax functions hold the same constants, which the
VM's constant pool stores once (ResNet-18, two variants: 47.05 MB against 47.04 MB for one).
"""
from __future__ import annotations

from ..deploy.variants import DEFAULT_ENTRY, entry_name, symbol_suffix


def merge_variants(modules: dict, *, default: str):
    """`modules`: {label: IRModule with records applied}; `default`: the label whose `main` is `main`."""
    from tvm import relax
    from tvm.relax.expr_functor import PyExprMutator, mutator
    from tvm.relax.utils import copy_with_new_vars

    if default not in modules:
        raise ValueError(f"default variant {default!r} is not one of {sorted(modules)}")
    builder = relax.BlockBuilder()
    entries = {}
    for label, mod in modules.items():
        suffix = symbol_suffix(label)
        renamed = {}  # old name -> GlobalVar in the merged module
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function):
                renamed[gv.name_hint] = builder.add_func(func, f"{gv.name_hint}__{suffix}")

        @mutator
        class _Rename(PyExprMutator):
            def visit_global_var_(self, op):
                if op.name_hint not in renamed:
                    # a Relax function calling another Relax function: not produced by our import
                    raise ValueError(f"{op.name_hint} is not a kernel; cannot merge variant {label}")
                return renamed[op.name_hint]

        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                name = entry_name(label) if gv.name_hint == DEFAULT_ENTRY else f"{gv.name_hint}__{suffix}"
                # fresh Vars: one Var defined in two functions breaks FuseOps ("appears at multiple
                # definition sites"), and every variant's `main` starts from the same parameters
                body = copy_with_new_vars(_Rename().visit_expr(func)).with_attr("global_symbol", name)
                builder.add_func(body, name)
                if gv.name_hint == DEFAULT_ENTRY:
                    entries[label] = body
    merged = builder.get()
    merged[DEFAULT_ENTRY] = copy_with_new_vars(entries[default]).with_attr("global_symbol", DEFAULT_ENTRY)
    first = next(iter(modules.values()))
    if first.attrs is not None and len(first.attrs):
        merged = merged.with_attrs(first.attrs)
    # every variant's kernels of another kind (clients.compiler.with_kernels), not only the first's
    external = [m for mod in modules.values() if mod.attrs is not None and "external_mods" in mod.attrs
                for m in mod.attrs["external_mods"]]
    return merged.with_attr("external_mods", external) if external else merged
