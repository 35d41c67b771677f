"""What a database was tuned for, kept beside it, so that --resume never mixes runs.

A resumed run must tune the same model for the same target, device and share; otherwise its
records would be picked for builds they were never measured for (lookups ignore the target).
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os

from ..atomic import write_json_atomic
from ..errors import TunekitError

IDENTITY_FILE = "tunekit-run.json"
# The numerics gate's config overrides (max_output_error, min_output_cosine) of the run that made the records:
# not part of the identity (a resumed run may loosen them), but `evaluate` judges the records' builds by them.
BOUND_FILE = "tunekit-numerics-bound.json"


def model_digest(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def run_identity(*, model_sha256: str, share_label: str, target, device: str, input_shapes: dict,
                 precision: str = "fp32") -> dict:
    """`model_sha256`: the ONNX file's digest (model_digest), or a torch module's (frontend.torch_loader)."""
    return {"model_sha256": model_sha256, "share": share_label, "target": str(target.export()),
            "device": device, "input_shapes": {k: list(v) for k, v in sorted(input_shapes.items())},
            "precision": precision}


def read_identity(db_dir: str) -> dict:
    """What a database was tuned for ({} when it says nothing); records before precision was
    recorded were tuned in fp32."""
    path = os.path.join(db_dir, IDENTITY_FILE)
    try:
        with open(path) as fh:
            identity = json.load(fh)
    except (OSError, ValueError):
        return {}
    identity.setdefault("precision", "fp32")
    return identity


def check_or_write(db_dir: str, identity: dict, *, resume: bool, existing_trials: int) -> None:
    path = os.path.join(db_dir, IDENTITY_FILE)
    if existing_trials and not resume:
        raise TunekitError(f"{db_dir} already holds {existing_trials} trials from an earlier run: "
                           "pass --resume to continue it, or choose another --out")
    if os.path.isfile(path) and (resume or existing_trials):
        before = read_identity(db_dir)
        for key, label in (("model_sha256", "model"), ("share", "share"), ("target", "target"),
                           ("device", "device"), ("input_shapes", "input shapes"), ("precision", "precision")):
            if before.get(key) != identity.get(key):
                raise TunekitError(f"cannot resume: {db_dir} was tuned for another {label} "
                                   f"({before.get(key)!r}, now {identity.get(key)!r})")
        return
    os.makedirs(db_dir, exist_ok=True)
    write_json_atomic(path, identity, indent=1)


@contextlib.contextmanager
def out_dir_lock(out_dir: str):
    """One run per out dir at a time: a second one is refused instead of interleaving records."""
    os.makedirs(out_dir, exist_ok=True)
    fh = open(os.path.join(out_dir, ".tunekit.lock"), "a+")
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        raise TunekitError(f"another tunekit run is using {out_dir}; wait for it or choose another --out") from None
    try:
        yield
    finally:
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


def write_bound_overrides(db_dir: str, overrides: dict) -> None:
    """The numerics gate's overrides this run tunes under ({name: value or None}), rewritten by every run."""
    os.makedirs(db_dir, exist_ok=True)
    write_json_atomic(os.path.join(db_dir, BOUND_FILE), overrides, indent=1)


def read_bound_overrides(db_dir: str) -> dict:
    """What write_bound_overrides kept; {} for records made before it (the defaults)."""
    try:
        with open(os.path.join(db_dir, BOUND_FILE)) as fh:
            overrides = json.load(fh)
    except (OSError, ValueError):
        return {}
    return {k: overrides.get(k) for k in ("max_output_error", "min_output_cosine")}
