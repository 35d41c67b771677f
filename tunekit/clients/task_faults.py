"""Injected task failures, so that tests can show a failing task keeps its untuned kernel while the rest of the
model is tuned (the real model, the real engine; nothing else changes).

TUNEKIT_INJECT_TASK_FAULT="<stage>:<part of a task name>[,...]" makes that stage fail for every task whose name
contains the part. Stages: design_space (making its design space raises), search (its search raises), build
(every candidate of it fails to build), untuned (its untuned kernel, the per-task baseline, fails to build),
untuned_model (a model whose name contains the part: its untuned model is refused, as the numerics gate would),
wrong_kernel (its tuned kernel, once applied to the model, fills its output with ones: a record that builds and runs
but computes the wrong thing), crash_kernel (its tuned kernel, applied, crashes the process that runs the model with SIGSEGV, as
a kernel that reads out of bounds does; CPU targets)."""
from __future__ import annotations

import os
import signal

ENV = "TUNEKIT_INJECT_TASK_FAULT"
STAGES = ("design_space", "search", "build", "untuned", "untuned_model", "wrong_kernel", "crash_kernel")
APPLIED_STAGES = ("wrong_kernel", "crash_kernel")  # faults in a tuned kernel the model is built with


class InjectedFault(RuntimeError):
    """A failure asked for through TUNEKIT_INJECT_TASK_FAULT."""


def injected(stage: str, task_name: str) -> str | None:
    """The injected error of `stage` for `task_name`, or None (the usual case: the variable is unset)."""
    for wanted, part in _items():
        if wanted == stage and part in task_name:
            return f"injected {stage} failure ({ENV})"
    return None


def applied_fault(task_name: str) -> str | None:
    """The wrong_kernel or crash_kernel fault injected into `task_name`'s tuned kernel, or None."""
    return next((stage for stage in APPLIED_STAGES if injected(stage, task_name)), None)


def faulty_kernels(mod):
    """`mod` (records applied) with each tuned function of a wrong_kernel task replaced by one of the same
    signature that fills its output with ones, and of a crash_kernel task by one that raises SIGSEGV; untuned functions
    are left alone."""
    faults = [(stage, part) for stage, part in _items() if stage in APPLIED_STAGES]
    if not faults:
        return mod
    from tvm import tirx

    for gvar, func in list(mod.functions_items()):
        stage = next((stage for stage, part in faults if part in gvar.name_hint), None)
        if stage and isinstance(func, tirx.PrimFunc) and int((func.attrs or {}).get("tirx.is_scheduled", 0)) == 1:
            mod[gvar] = (_ones if stage == "wrong_kernel" else _crash)(func).with_attr("global_symbol", gvar.name_hint)
    return mod


def _crash(func):
    from tvm import te, tirx

    buffers = list(func.params)
    inputs = [te.placeholder(buf.shape, buf.dtype, f"in{i}") for i, buf in enumerate(buffers[:-1])]
    out = buffers[-1]
    segv = tirx.call_extern("int32", "raise", int(signal.SIGSEGV))
    crash = te.extern([out.shape], inputs, lambda ins, outs: tirx.Evaluate(segv), dtype=[out.dtype], name="crash")
    return te.create_prim_func([*inputs, crash])


def _ones(func):
    from tvm import te, tirx

    buffers = list(func.params)  # TVM 0.27: a PrimFunc's params are its buffers (shape, dtype)
    inputs = [te.placeholder(buf.shape, buf.dtype, f"in{i}") for i, buf in enumerate(buffers[:-1])]
    out = buffers[-1]
    ones = te.compute(out.shape, lambda *_: tirx.const(1, out.dtype), name="ones")
    return te.create_prim_func([*inputs, ones])


def _items():
    for item in os.environ.get(ENV, "").split(","):
        stage, _, part = item.strip().partition(":")
        if stage and part:
            yield stage, part


def raise_if_injected(stage: str, task_name: str) -> None:
    error = injected(stage, task_name)
    if error is not None:
        raise InjectedFault(error)
