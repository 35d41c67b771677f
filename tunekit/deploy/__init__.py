"""Use what you tuned: load a compiled model and call it, run it once, benchmark it at a share.

  metadata.py      the JSON beside every artifact (inputs, outputs, share, target, TVM version, ...)
  compat.py        can this artifact run here (TVM version, device kind, GPU architecture)
  arrays.py        numpy / torch arrays <-> TVM tensors (DLPack, no copy for torch)
  library.py       an artifact loaded as its file is now (dlopen keeps the first load of a path)
  locate.py        which artifact a path names: the file, or the one tuned model of a tune out dir
  model.py         load() -> TunedModel, callable with arrays
  runner.py        run_once(): inputs from .npy files (or random), outputs to an .npz
  bench.py         bench(): latency percentiles at a share in a pinned subprocess (bench_worker.py),
                   numerics against onnxruntime (tunekit.numerics)

Nothing here imports TVM or torch at import time.
"""
from .bench import BenchResult, bench
from .metadata import ArtifactMetadata, TensorSpec, metadata_for, metadata_path, read_metadata, write_metadata
from .model import TunedModel, load
from .runner import run_once

__all__ = ["load", "TunedModel", "run_once", "bench", "BenchResult", "ArtifactMetadata", "TensorSpec",
           "metadata_for", "metadata_path", "read_metadata", "write_metadata"]
