"""Run a compiled model once on inputs from .npy files (random ones where none are given) and
save its outputs: the smoke test of an artifact, and what `tunekit run` will call."""
from __future__ import annotations

import os
import time

import numpy as np

from ..errors import TunekitError
from .arrays import random_inputs
from .metadata import ArtifactMetadata
from .model import load
from .npzfiles import write_npz


def read_input_files(meta: ArtifactMetadata, paths: dict[str, str]) -> dict[str, np.ndarray]:
    """{name: .npy path} -> arrays, each checked against the input it is for (one line naming the
    input and the file when it does not fit)."""
    arrays = {}
    for name, path in paths.items():
        spec = meta.input(name)
        if spec is None:
            raise TunekitError(f"the model has no input {name!r}; its inputs are: "
                               f"{', '.join(s.name for s in meta.inputs)}")
        if not os.path.isfile(path):
            raise TunekitError(f"input {name!r}: file not found: {path}")
        try:
            array = np.load(path, allow_pickle=False)  # never unpickle: an .npy may come from anywhere
        except (OSError, ValueError) as exc:
            raise TunekitError(f"input {name!r}: {path} is not a readable .npy array ({exc})") from None
        if not isinstance(array, np.ndarray):
            raise TunekitError(f"input {name!r}: {path} holds several arrays (an .npz); give one .npy per input")
        if list(array.shape) != list(spec.shape) or array.dtype.name != spec.dtype:
            raise TunekitError(f"input {name!r} from {path}: expected {spec.describe()}, "
                               f"got shape {list(array.shape)} {array.dtype.name}")
        arrays[name] = array
    return arrays


def run_once(artifact: str, *, inputs: dict[str, str] | None = None, output: str | None = None,
             device=None, seed: int = 0) -> dict:
    """Run the model once. `inputs`: {input name: .npy path}; inputs not given are random.
    `output`: an .npz to write every output to (keys: the output names).
    Returns the outputs' names, shapes and dtypes, where each input came from, and the wall time."""
    model = load(artifact, device=device)
    given = read_input_files(model.metadata, inputs or {})
    generated = random_inputs(model.metadata, seed=seed)
    feed = {spec.name: given.get(spec.name, generated[spec.name]) for spec in model.inputs}
    start = time.perf_counter()
    result = model(**feed)  # numpy in -> numpy out, so the outputs are on the host when it returns
    wall_ms = (time.perf_counter() - start) * 1e3
    values = result if isinstance(result, tuple) else (result,)
    named = {spec.name: value for spec, value in zip(model.outputs, values)}
    if output:
        _write_outputs(output, named)
    return {"artifact": model.artifact, "device": str(model.device), "share": model.share,
            "inputs": {name: (inputs or {}).get(name, "random") for name in feed},
            "outputs": [{"name": name, "shape": list(value.shape), "dtype": value.dtype.name}
                        for name, value in named.items()],
            "output_path": output, "wall_ms": wall_ms}


def _write_outputs(path: str, named: dict[str, np.ndarray]) -> None:
    if not path.endswith(".npz"):
        raise TunekitError(f"output {path}: give a path ending in .npz")
    try:
        write_npz(path, named)
    except OSError as exc:
        raise TunekitError(f"cannot write outputs to {path}: {exc.strerror or exc}") from None
