"""Experimental options: a new knob warns when set, until a benchmark keeps it (then the warning goes) or
records it losing (then the knob, its code and its tests are deleted in that commit). As Optuna's
`warn_experimental_argument`."""
from __future__ import annotations

import warnings


class ExperimentalWarning(UserWarning):
    """A setting whose benefit is not yet measured: it may change or be removed without notice."""


def warn_experimental_argument(name: str) -> None:
    warnings.warn(f"{name} is experimental (not yet measured to help): it may change or be removed without notice",
                  ExperimentalWarning, stacklevel=3)
