"""Experimental options: a new knob warns when set, until a benchmark keeps it (then the warning goes) or
records it losing (then the knob, its code and its tests are deleted in that commit). As Optuna's
`warn_experimental_argument`."""
from __future__ import annotations

import os
import warnings


class ExperimentalWarning(UserWarning):
    """A setting whose benefit is not yet measured: it may change or be removed without notice."""


def warn_experimental_argument(name: str) -> None:
    warnings.warn(f"{name} is experimental (not yet measured to help): it may change or be removed without notice",
                  ExperimentalWarning, stacklevel=3)


# The key-tiled attention body for sequences whose K and V do not fit a block (frontend.attention_flash): off until
# a model tuned with it is measured at a share against the unfused chain (benchmarks/RESULTS.md, "h200x2-fleet").
ATTENTION_KEY_TILES_ENV = "TUNEKIT_EXPERIMENTAL_ATTENTION_KEY_TILES"


def attention_key_tiles() -> bool:
    """Whether TUNEKIT_EXPERIMENTAL_ATTENTION_KEY_TILES=1 asks for the key-tiled attention (an environment
    variable, so that every process preparing the model, the compile's included, prepares it the same way)."""
    wanted = os.environ.get(ATTENTION_KEY_TILES_ENV) == "1"
    if wanted:
        warn_experimental_argument(f"{ATTENTION_KEY_TILES_ENV}=1")
    return wanted
