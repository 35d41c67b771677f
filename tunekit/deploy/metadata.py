"""What a compiled model is, written next to it: `model-gpu40.so` -> `model-gpu40.json`.

A Relax VM executable carries no input names, no share and no record of the TVM that built it:
loading it on the wrong GPU, with another TVM or with a wrong input fails deep inside TVM (or
worse, runs). The metadata lets `tunekit.deploy.load` check all of that first and answer in one line.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timezone

from ..atomic import write_json_atomic
from ..errors import TunekitError
from ..targets import target_dict

METADATA_FORMAT = 1  # bump when a field changes meaning; readers refuse a newer format
PRECISIONS = ("fp32", "fp16")
DEVICE_KINDS = {"llvm": "cpu", "cuda": "cuda"}  # TVM target kind -> where the artifact runs
# The files of a share's database that decide what gets compiled: the workloads and records, and
# the untuned baselines that decide which records are applied (records/baselines.py).
DATABASE_FILES = ("database_workload.json", "database_tuning_record.json", "tunekit-baselines.json")


@dataclass(frozen=True)
class TensorSpec:
    """One model input or output: its name, shape and dtype (numpy names: "float32", "int64")."""

    name: str
    shape: list  # ints; a symbolic output dim stays a string, e.g. "n"
    dtype: str

    def to_dict(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    def describe(self) -> str:
        return f"shape {list(self.shape)} {self.dtype}"


@dataclass
class ArtifactMetadata:
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    share: str | None          # "gpu40", "cpu50"; None for an untuned build
    precision: str             # "fp32" or "fp16"
    target: dict               # the TVM target, as Target.export() gives it (Target(dict) rebuilds it)
    device_kind: str           # "cpu" or "cuda"
    arch: str | None           # "sm_90a" for CUDA (the target's), None on CPU
    tuned_trials: int
    tvm_version: str
    records_digest: str | None  # sha256 over the share's database files, None when untuned
    model_sha256: str
    created: str               # ISO 8601, UTC
    format: int = METADATA_FORMAT
    extra: dict = field(default_factory=dict)  # keys a newer tunekit of the same format added

    def to_dict(self) -> dict:
        data = dataclasses.asdict(self)
        data["inputs"] = [spec.to_dict() for spec in self.inputs]
        data["outputs"] = [spec.to_dict() for spec in self.outputs]
        extra = data.pop("extra")
        return {"format": data.pop("format"), **data, **extra}

    @classmethod
    def from_dict(cls, data: dict, *, source: str) -> "ArtifactMetadata":
        if not isinstance(data, dict):
            raise TunekitError(f"{source} is not a tunekit metadata file (expected a JSON object)")
        version = data.get("format")
        if not isinstance(version, int):
            raise TunekitError(f"{source} is not a tunekit metadata file (no 'format' version)")
        if version > METADATA_FORMAT:
            raise TunekitError(f"{source} has metadata format {version}, newer than this tunekit reads "
                               f"({METADATA_FORMAT}); upgrade tunekit")
        names = [f.name for f in dataclasses.fields(cls) if f.name not in ("extra", "format")]
        missing = [name for name in names if name not in data]
        if missing:
            raise TunekitError(f"{source} lacks metadata field(s) {', '.join(missing)}")
        values = {name: data[name] for name in names}
        try:
            values["inputs"] = [_spec(item) for item in data["inputs"]]
            values["outputs"] = [_spec(item) for item in data["outputs"]]
        except (TypeError, KeyError) as exc:
            raise TunekitError(f"{source} has a malformed input/output entry ({exc})") from None
        extra = {k: v for k, v in data.items() if k not in names and k != "format"}
        return cls(**values, format=version, extra=extra)

    def input(self, name: str) -> TensorSpec | None:
        return next((spec for spec in self.inputs if spec.name == name), None)


def _spec(item: dict) -> TensorSpec:
    return TensorSpec(str(item["name"]), list(item["shape"]), str(item["dtype"]))


def metadata_path(artifact: str) -> str:
    """`model-gpu40.so` -> `model-gpu40.json` (same stem, beside it)."""
    return os.path.splitext(artifact)[0] + ".json"


def write_metadata(artifact: str, meta: ArtifactMetadata) -> str:
    return write_json_atomic(metadata_path(artifact), meta.to_dict())


def read_metadata(artifact: str) -> ArtifactMetadata:
    path = metadata_path(artifact)
    if not os.path.isfile(path):
        raise TunekitError(f"no metadata for {artifact}: {path} is missing (was the artifact built by tunekit?)")
    try:
        with open(path) as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise TunekitError(f"cannot read metadata {path}: {exc}") from None
    return ArtifactMetadata.from_dict(data, source=path)


def records_digest(db_dir: str | None) -> str | None:
    """sha256 over the share's database files (name and bytes, fixed order), None without any:
    two artifacts with the same digest were compiled from the same records."""
    if not db_dir:
        return None
    digest, found = hashlib.sha256(), False
    for name in DATABASE_FILES:
        path = os.path.join(db_dir, name)
        if not os.path.isfile(path):
            continue
        found = True
        digest.update(name.encode() + b"\0")
        with open(path, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        digest.update(b"\0")
    return digest.hexdigest() if found else None


def device_kind_of(target) -> str:
    kind = target.kind.name
    if kind not in DEVICE_KINDS:
        raise TunekitError(f"tunekit deploys CPU (llvm) and CUDA artifacts, not {kind!r} ones")
    return DEVICE_KINDS[kind]


def _dim(value):
    # IntImm -> int; a symbolic dim (a tirx Var or an expression of one) -> its text, e.g. "n"
    return int(value) if type(value).__name__ == "IntImm" else str(value)


def _tensor_spec(name: str, ty, *, what: str) -> TensorSpec:
    if type(ty).__name__ != "TensorType":
        raise TunekitError(f"{what} {name!r} is a {type(ty).__name__}, not a tensor; tunekit deploys "
                           f"models whose inputs and outputs are tensors")
    shape = [_dim(v) for v in ty.shape.values] if ty.shape is not None else ["?"] * max(ty.ndim, 0)
    return TensorSpec(name, shape, str(ty.dtype))


def describe_inputs(loaded, prepared_mod) -> list[TensorSpec]:
    """The compiled `main`'s parameters, named as the ONNX graph names them (Relax may rename
    them), in the order `main` takes them."""
    params = prepared_mod["main"].params
    names = list(loaded.inputs.shapes)
    if len(params) != len(names):
        raise TunekitError(f"the compiled model takes {len(params)} inputs but the ONNX graph has "
                           f"{len(names)} ({', '.join(names)}); weights imported as inputs are not supported")
    return [_tensor_spec(name, param.ty, what="input") for name, param in zip(names, params)]


def describe_outputs(loaded, prepared_mod) -> list[TensorSpec]:
    """`main`'s return type (a tensor, or a tuple of them), named after the ONNX graph outputs."""
    ret = prepared_mod["main"].ret_ty
    types = list(ret.fields) if type(ret).__name__ == "TupleType" else [ret]
    names = list(loaded.output_names)
    if len(names) != len(types):
        names = [f"output{i}" for i in range(len(types))]  # the graph's outputs were folded or split
    return [_tensor_spec(name, ty, what="output") for name, ty in zip(names, types)]


def target_arch(target) -> str | None:
    if device_kind_of(target) != "cuda":
        return None
    arch = target.attrs.get("arch")
    return str(arch) if arch else None


def metadata_for(*, loaded, target, share_label: str | None, precision: str, tuned_trials: int,
                 db_dir: str | None, prepared_mod) -> ArtifactMetadata:
    """The metadata of an artifact compiled from `prepared_mod` for `target` (call after compiling)."""
    import tvm

    if precision not in PRECISIONS:
        raise TunekitError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    return ArtifactMetadata(
        inputs=describe_inputs(loaded, prepared_mod), outputs=describe_outputs(loaded, prepared_mod),
        share=share_label, precision=precision, target=target_dict(target),
        device_kind=device_kind_of(target), arch=target_arch(target), tuned_trials=int(tuned_trials),
        tvm_version=tvm.__version__, records_digest=records_digest(db_dir), model_sha256=loaded.digest,
        created=datetime.now(timezone.utc).isoformat(timespec="seconds"))
