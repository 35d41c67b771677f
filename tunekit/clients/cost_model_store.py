"""The XGBoost cost model kept with a share's records, so a resumed (or warm-started) run does not
learn the share's kernels from scratch.

XGBModel.save/load keep the booster and every feature vector it was trained on (a tar with a
pickled numpy array: load only models from out dirs you trust, as with any tunekit out dir).
"""
from __future__ import annotations

import logging
import os
import warnings

log = logging.getLogger("tunekit.cost_model")

COST_MODEL_FILE = "tunekit-cost-model.tar"


def _quiet_xgboost():
    """XGBoost prints a note on its file format at every save (its own logger, not a Python warning)."""
    import xgboost

    return xgboost.config_context(verbosity=0)


def model_path(records_dir: str) -> str:
    return os.path.join(records_dir, COST_MODEL_FILE)


def load_into(cost_model, *, candidates: list[str]) -> dict:
    """Load the first existing saved model among `candidates` (paths) into `cost_model`.
    Returns what the report records: where it came from and how many samples it holds."""
    for path in candidates:
        if not path or not os.path.isfile(path):
            continue
        try:
            with warnings.catch_warnings(), _quiet_xgboost():  # XGBoost's notes on its own file format
                warnings.simplefilter("ignore")
                cost_model.load(path)
        except Exception as exc:  # e.g. saved before it had trained (no booster): start from scratch
            log.info("cost model %s not loaded: %s", path, exc)
            continue
        return {"loaded_from": path, "samples_at_start": int(getattr(cost_model, "data_size", 0))}
    return {"loaded_from": None, "samples_at_start": 0}


def save(cost_model, records_dir: str) -> str | None:
    """Save beside the records, atomically (a crash mid-save leaves the previous model)."""
    if not records_dir or int(getattr(cost_model, "data_size", 0)) == 0:
        return None
    path = model_path(records_dir)
    tmp = path + ".tmp.tar"
    with warnings.catch_warnings(), _quiet_xgboost():
        warnings.simplefilter("ignore")
        cost_model.save(tmp)
    os.replace(tmp, path)
    return path
