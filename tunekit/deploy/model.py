"""Use what you tuned: `tunekit.deploy.load("model-gpu40.so")(x)`.

    model = load("out/model-gpu40.so")           # checks TVM version, GPU architecture, device
    y = model(x)                                  # numpy in -> numpy out
    y = model(x=torch_cuda_tensor)                # torch in -> torch out, same device, no copy
"""
from __future__ import annotations

import contextlib
import os

from ..errors import TunekitError
from .arrays import TORCH, array_kind, from_tvm, input_problem, to_tvm
from .compat import DeviceSpec, check_runnable, parse_device
from .library import load_library
from .locate import locate_artifact
from .metadata import ArtifactMetadata, TensorSpec, read_metadata
from .variants import AUTO, VariantChoice, choose_variant, variants_of


class TunedModel:
    """A compiled model loaded on one device. Call it with the inputs, positionally (in the order
    of `.inputs`) or by name; one output comes back as an array, several as a tuple."""

    def __init__(self, *, artifact: str, metadata: ArtifactMetadata, device: DeviceSpec, vm,
                 choice: VariantChoice | None = None):
        self.artifact = artifact
        self.metadata = metadata
        self.device = device
        self.vm = vm  # the Relax VirtualMachine, for callers that time or profile it themselves
        # a share-robust artifact has one entry per share; `choice` says which one this model calls
        self.choice = choice or VariantChoice(None, "main", "only")
        self._main = vm[self.choice.entry]

    @property
    def entry(self) -> str:
        """The Relax function every call runs: "main", or a share's variant of a robust artifact."""
        return self.choice.entry

    @property
    def variant(self) -> str | None:
        """The share whose schedules this model runs (a robust artifact), None for `main`."""
        return self.choice.label

    @property
    def inputs(self) -> list[TensorSpec]:
        return self.metadata.inputs

    @property
    def outputs(self) -> list[TensorSpec]:
        return self.metadata.outputs

    @property
    def share(self) -> str | None:
        return self.metadata.share

    @property
    def precision(self) -> str:
        return self.metadata.precision

    @property
    def target(self) -> dict:
        """The TVM target as a JSON dict: `tvm.target.Target(model.target)` rebuilds it."""
        return self.metadata.target

    @property
    def tvm_version(self) -> str:
        return self.metadata.tvm_version

    def __repr__(self) -> str:
        variant = f", variant={self.variant}" if self.variant else ""
        return (f"TunedModel({os.path.basename(self.artifact)!r}, share={self.share}{variant}, "
                f"precision={self.precision}, device={self.device})")

    def bind(self, args: tuple, kwargs: dict) -> list:
        """The call's arguments in the order `main` takes them; one TunekitError for the first
        wrong count, unknown or missing name, shape, dtype or device."""
        names = [spec.name for spec in self.inputs]
        if len(args) > len(names):
            raise TunekitError(f"{self._who()} takes {len(names)} input(s) ({', '.join(names)}), "
                               f"got {len(args)} positional")
        bound = dict(zip(names, args))
        for name, value in kwargs.items():
            if name not in names:
                raise TunekitError(f"{self._who()} has no input {name!r}; its inputs are: {', '.join(names)}")
            if name in bound:
                raise TunekitError(f"input {name!r} given twice (positionally and by name)")
            bound[name] = value
        missing = [spec for spec in self.inputs if spec.name not in bound]
        if missing:
            spec = missing[0]
            raise TunekitError(f"missing input {spec.name!r} ({spec.describe()})")
        for spec in self.inputs:
            problem = input_problem(spec, bound[spec.name], device=self.device)
            if problem:
                raise TunekitError(f"input {spec.name!r}: {problem}")
        kinds = {array_kind(bound[name]) for name in names}
        if len(kinds) > 1:
            raise TunekitError("the inputs mix numpy arrays and torch tensors; pass one kind "
                               "(outputs come back as that kind)")
        return [bound[name] for name in names]

    def __call__(self, *args, **kwargs):
        values = self.bind(args, kwargs)
        kind = array_kind(values[0]) if values else "numpy"
        tensors = [to_tvm(value, device=self.device) for value in values]
        with self._stream(kind):
            result = self._main(*tensors)
        outputs = [from_tvm(tensor, kind=kind) for tensor in flatten_outputs(result)]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _stream(self, kind: str):
        """Run on torch's current CUDA stream when the inputs are torch CUDA tensors: the kernels
        then follow the work that produced the inputs and precede whatever uses the outputs, with
        no device-wide synchronisation."""
        if kind != TORCH or self.device.kind != "cuda":
            return contextlib.nullcontext()
        import torch
        import tvm_ffi

        stream = torch.cuda.current_stream(self.device.index).cuda_stream
        return tvm_ffi.use_raw_stream(self.device.tvm_device(), stream)

    def _who(self) -> str:
        return os.path.basename(self.artifact)


def flatten_outputs(result) -> list:
    """The VM returns one tensor, or an Array (tuple) of them."""
    if hasattr(result, "shape") and hasattr(result, "dtype"):
        return [result]
    return list(result)


def load(artifact: str, *, device=None, variant: str | None = AUTO) -> TunedModel:
    """Load a compiled model (`.so`, or the out dir of a `tunekit tune` run that holds one) and its
    metadata (`.json` beside it) on `device`
    (None: the artifact's own kind, device 0; or "cpu", "cuda", "cuda:1", a tvm or torch device).
    Refused in one line when it cannot run here (TVM version, GPU architecture, no GPU).

    `variant` matters only for a share-robust artifact (`tunekit tune --robust`), which carries one
    set of schedules per share: "auto" times each on random inputs here (about a second) and keeps
    the fastest, a share label ("gpu40") takes that share's, None or "main" the static choice."""
    artifact = locate_artifact(artifact)
    meta = read_metadata(artifact)
    where = parse_device(device, default_kind=meta.device_kind)
    check_runnable(artifact, meta, where)
    from tvm import relax

    try:
        vm = relax.VirtualMachine(load_library(artifact), where.tvm_device())
    except Exception as exc:  # TVM raises its own error types; the user needs the one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
        raise TunekitError(f"cannot load {artifact}: {first[:300]}") from None
    variants = variants_of(meta.extra)
    args = []
    if variants and variant == AUTO:
        from .arrays import random_inputs, to_tvm

        args = [to_tvm(array, device=where) for array in random_inputs(meta).values()]
    choice = choose_variant(vm, where.tvm_device(), args, variants, variant=variant)
    return TunedModel(artifact=artifact, metadata=meta, device=where, vm=vm, choice=choice)
