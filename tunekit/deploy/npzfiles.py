"""Named arrays to and from .npz files, written whole or not at all.

Not `np.savez(path, **named)`: a tensor named "file" or "allow_pickle" (ONNX allows any name)
would collide with savez's own parameters.
"""
from __future__ import annotations

import os
import zipfile

import numpy as np


def write_npz(path: str, named: dict[str, np.ndarray]) -> str:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in named.items():
            with archive.open(name + ".npy", "w", force_zip64=True) as fh:
                np.lib.format.write_array(fh, np.asanyarray(array), allow_pickle=False)
    os.replace(tmp, path)  # never leave half an .npz under the final name
    return path


def read_npz(path: str) -> dict[str, np.ndarray]:
    """{name: array}, in the order they were written."""
    with np.load(path, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}
