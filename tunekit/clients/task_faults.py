"""Injected task failures, so that tests can show a failing task keeps its untuned kernel while the rest of the
model is tuned (the real model, the real engine; nothing else changes).

TUNEKIT_INJECT_TASK_FAULT="<stage>:<part of a task name>[,...]" makes that stage fail for every task whose name
contains the part. Stages: design_space (making its design space raises), search (its search raises), build
(every candidate of it fails to build)."""
from __future__ import annotations

import os

ENV = "TUNEKIT_INJECT_TASK_FAULT"
STAGES = ("design_space", "search", "build")


class InjectedFault(RuntimeError):
    """A failure asked for through TUNEKIT_INJECT_TASK_FAULT."""


def injected(stage: str, task_name: str) -> str | None:
    """The injected error of `stage` for `task_name`, or None (the usual case: the variable is unset)."""
    for item in os.environ.get(ENV, "").split(","):
        wanted, _, part = item.strip().partition(":")
        if wanted == stage and part and part in task_name:
            return f"injected {stage} failure ({ENV})"
    return None


def raise_if_injected(stage: str, task_name: str) -> None:
    error = injected(stage, task_name)
    if error is not None:
        raise InjectedFault(error)
