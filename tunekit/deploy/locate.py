"""Which compiled model a path names: the artifact itself, or the out dir of a `tunekit tune` run.

`tune` ends by printing its out dir, and that is what users pass on. The dir holds the tuned model of
each share (`<model>-<share>.so`), the share-robust ones of `--robust`, and the untuned baselines
(`untuned.so`, or `untuned-<share>.so` with several shares), each with its metadata beside it. A dir
names a model only when it holds exactly one that is not a baseline; otherwise the error lists them.
"""
from __future__ import annotations

import os

from ..errors import TunekitError
from .metadata import metadata_path

_UNTUNED = "untuned"


def untuned_artifact_name(share_label: str | None) -> str:
    """The untuned baseline's file name in a tune out dir: one share's, or `share_label`'s of several."""
    return f"{_UNTUNED}.so" if share_label is None else f"{_UNTUNED}-{share_label}.so"


def locate_artifact(path) -> str:
    """`path` if it is a file; the one tuned model in `path` if it is a tune out dir; else one line
    that says what is there."""
    path = os.fspath(path)
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise TunekitError(f"compiled model not found: {path}")
    found = sorted(name for name in os.listdir(path)
                   if name.endswith(".so") and not _is_baseline(name)
                   and os.path.isfile(metadata_path(os.path.join(path, name))))
    if len(found) == 1:
        return os.path.join(path, found[0])
    if not found:
        raise TunekitError(f"no compiled model in {path}: a tunekit tune out dir holds <model>-<share>.so "
                           "with its .json beside it")
    raise TunekitError(f"{path} holds {len(found)} compiled models ({', '.join(found)}): name one, "
                       f"e.g. {os.path.join(path, found[0])}")


def _is_baseline(name: str) -> bool:
    return name == untuned_artifact_name(None) or name.startswith(f"{_UNTUNED}-")
