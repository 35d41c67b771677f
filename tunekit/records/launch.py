"""How a GPU schedule launches: blocks, threads per block, and waves of blocks on a share's SMs.

The best schedule at a small share may launch differently from the best at 100%: at 40% of a
132-SM GPU (52 SMs) a kernel of 132 blocks runs in 3 waves, not 1. The shape is
read off the scheduled TIR's `T.thread_binding` loops (TVM 0.27 has no Python statement visitor):
per thread tag the largest extent, then blocks = the product over blockIdx.*, threads = the
product over threadIdx.*. A schedule with several kernels reports its largest.
"""
from __future__ import annotations

import math
import re

# T.thread_binding(14, thread=...), (0, 14, ...), (T.int64(14), ...): the extent is the last number
_BINDING = re.compile(r'T\.thread_binding\(([^"]*?)thread="(blockIdx|threadIdx)\.([xyz])"')
_NUMBER = re.compile(r"\d+")


def launch_of_script(script: str) -> dict | None:
    """{"blocks", "threads"} of a scheduled PrimFunc's TVMScript; None without thread bindings (CPU)."""
    extents: dict[tuple[str, str], int] = {}
    for args, kind, axis in _BINDING.findall(script):
        numbers = _NUMBER.findall(args.replace("T.int64(", "(").replace("T.int32(", "("))
        if numbers:
            extents[(kind, axis)] = max(extents.get((kind, axis), 0), int(numbers[-1]))
    if not extents:
        return None
    blocks = math.prod(v for (kind, _), v in extents.items() if kind == "blockIdx")
    threads = math.prod(v for (kind, _), v in extents.items() if kind == "threadIdx")
    return {"blocks": blocks, "threads": threads}


def launch_of_trace(mod, trace) -> dict | None:
    """The launch shape of `trace` applied to the workload `mod`; None when it cannot be replayed."""
    from tvm.s_tir import Schedule

    try:
        sch = Schedule(mod)
        trace.apply_to_schedule(sch, remove_postproc=False)
        return launch_of_script(sch.mod.script())
    except Exception:  # a trace this TVM cannot replay any more: no shape, not an error
        return None


def with_waves(launch: dict | None, sm_count: int | None) -> dict | None:
    """`launch` plus "waves": blocks per SM at the share, rounded up (1 = every block at once)."""
    if launch is None or not sm_count:
        return launch
    return {**launch, "waves": math.ceil(launch["blocks"] / sm_count)}


def best_launches(db_dir: str) -> dict[str, dict]:
    """{workload key: launch shape of its best record} for a share's database (GPU records only)."""
    from .baselines import workload_key
    from .database import open_best_records

    database = open_best_records(db_dir)  # each workload's best record only: the others' traces are not parsed
    shapes: dict[str, dict] = {}
    seen = set()
    for record in database.get_all_tuning_records():
        key = workload_key(record.workload.mod)
        if key in seen:
            continue
        seen.add(key)
        top = database.get_top_k(record.workload, 1)
        shape = launch_of_trace(record.workload.mod, top[0].trace) if top else None
        if shape is not None:
            shapes[key] = shape
    return shapes
