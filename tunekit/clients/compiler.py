"""Compile a prepared Relax module with (or without) tuning records, and export the artifact."""
from __future__ import annotations

import os


def compile_and_export(*, prepared_mod, target, database, path: str) -> str:
    import tvm
    from tvm.s_tir import meta_schedule as ms

    if database is None:
        # Untuned baseline: the default pipeline (DLight schedules GPU kernels).
        executable = tvm.compile(prepared_mod, target=target)
    else:
        executable = ms.relax_integration.compile_relax(database, prepared_mod, target, None)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp.so"
    executable.export_library(tmp)
    os.replace(tmp, path)  # never leave a half-written artifact under the final name
    return path
