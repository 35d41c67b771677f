"""What every command needs before it measures anything: the model, the out dir, and a session at
the share (the MPS daemon on a GPU, the pinned environment), plus the environment a report records.

Used by the pipeline, both executors, `profile`, `evaluate` and the SLO walk: one place for each.
"""
from __future__ import annotations

import contextlib
import logging
import os
import platform
from dataclasses import dataclass
from typing import Callable

from ..errors import TunekitError
from ..shares.share import Share, share_kind

log = logging.getLogger("tunekit")


@dataclass
class LoadedModel:
    """A model ready to tune, whatever it came from (an ONNX file, or a PyTorch module)."""

    name: str          # what out dirs and artifacts are named after
    path: str | None   # the ONNX file (None for a module)
    onnx: object       # the checked onnx.ModelProto (None for a module)
    inputs: object     # frontend.onnx_loader.ModelInputs (names, shapes, dtypes)
    mod: object        # the Relax IRModule, fresh from import
    output_names: list
    digest: str        # what --resume checks the model against (records.identity)
    reference: Callable[[dict], list]  # inputs -> the fp32 outputs every artifact is held to

    @property
    def source(self) -> str:
        return "onnx" if self.onnx is not None else "torch"


def load_model(model, input_shapes: dict | None = None, *, example_inputs=None) -> LoadedModel:
    """An ONNX path (loaded, checked, dynamic dims fixed) or a torch.nn.Module (through torch.export,
    at `example_inputs`), imported into Relax."""
    from ..frontend.torch_loader import import_module, is_torch_module, module_digest

    if is_torch_module(model):
        mod, inputs, outputs, reference = import_module(model, example_inputs)
        return LoadedModel(type(model).__name__.lower(), None, None, inputs, mod, outputs,
                           module_digest(model, example_inputs), reference)
    if not isinstance(model, (str, os.PathLike)):
        raise TunekitError(f"the model must be an ONNX file path or a torch.nn.Module, not {type(model).__name__}")
    return _load_onnx(os.fspath(model), input_shapes)


def _load_onnx(path: str, input_shapes: dict | None) -> LoadedModel:
    from ..frontend.onnx_loader import import_to_relax, load_onnx, model_inputs
    from ..numerics import onnxruntime_outputs
    from ..records.identity import model_digest

    model = load_onnx(path)
    inputs = model_inputs(model, input_shapes or {})
    return LoadedModel(os.path.splitext(os.path.basename(path))[0], path, model, inputs,
                       import_to_relax(model, inputs), [o.name for o in model.graph.output], model_digest(path),
                       lambda sample: onnxruntime_outputs(model, sample))


def check_out_dir(out: str) -> None:
    """Fail in one line, before minutes of work, when results could not be written."""
    try:
        os.makedirs(out, exist_ok=True)
        probe = os.path.join(out, ".tunekit-write-test")
        with open(probe, "w") as fh:
            fh.write("ok")
        os.remove(probe)
    except OSError as exc:
        raise TunekitError(f"cannot write to out dir {out}: {exc.strerror or exc}") from None


def resolve_share(gpu_pct, cpu_pct) -> Share:
    """One share from the --gpu-pct / --cpu-pct values (an int each); the default is 50% of the CPU
    cores, since a GPU is not guaranteed (laptops, CI) and a CPU share always is."""
    from ..shares.mps import require_gpu

    kind = share_kind(gpu_pct, cpu_pct)
    if kind == "gpu":
        require_gpu()
        return Share("gpu", int(gpu_pct))
    return Share("cpu", int(cpu_pct) if cpu_pct is not None else 50)


def device_name(share: Share) -> str:
    """What a share's records were measured on (part of a run's identity)."""
    from ..shares.cpu import cpu_model
    from ..shares.mps import gpu_name

    return (gpu_name() or "unknown GPU") if share.kind == "gpu" else cpu_model()


class ShareSession:
    """Everything that exists while we work at one share: its booking in the machine's ledger
    (shares.ledger: pct x servers of the device, refused past 100% unless `oversubscribe`, after
    waiting up to `wait_s` for other jobs), the MPS daemon tunekit jobs share (GPU; a daemon the
    environment names is used as is), and the pinned environment every measuring process gets (on
    a CPU, the cores the ledger set aside, away from other jobs' cores)."""

    def __init__(self, share: Share, *, allow_unenforced: bool, servers: int = 1, oversubscribe: bool = False,
                 wait_s: float = 0.0, within: "ShareSession | None" = None):
        """`within`: an open session of a larger share this one takes turns with (measure every share):
        no booking of its own (they never measure at once), its cores (CPU) or its MPS daemon (GPU)."""
        self.share = share
        self.within = within
        self.allow_unenforced = allow_unenforced
        self.servers, self.oversubscribe, self.wait_s = servers, oversubscribe, wait_s
        self.mps = None
        self.booking = None
        self.sm_count = None
        self.enforced = True
        self.pinned = None
        self._latency = None
        self._stack = contextlib.ExitStack()

    @classmethod
    def for_tuning(cls, share: Share, config, *, oversubscribe: bool = False,
                   within: "ShareSession | None" = None) -> "ShareSession":
        """The session of a tuning run (a TuneConfig): its servers, --oversubscribe, --wait-for-share."""
        return cls(share, allow_unenforced=config.allow_unenforced_share, servers=config.servers,
                   oversubscribe=config.oversubscribe or oversubscribe, wait_s=config.share_wait_s, within=within)

    def __enter__(self) -> "ShareSession":
        try:
            self._open()
        except BaseException:
            self._stack.close()
            raise
        return self

    def _open(self) -> None:
        from ..shares import ledger
        from ..shares.pinning import pinned_env

        if self.within is not None:
            self._open_within(self.within)
            return
        device = "cpu" if self.share.kind == "cpu" else ledger.gpu_device()
        self.booking = self._stack.enter_context(ledger.book(
            device, self.share.pct * self.servers, servers=self.servers, oversubscribe=self.oversubscribe,
            wait_s=self.wait_s, cores=len(self.share.cpu_cores()) if self.share.kind == "cpu" else None))
        if self.share.kind == "cpu":
            self.pinned = pinned_env(self.share, cores=self.booking.cores)
            return
        from ..shares.mps import sm_count_at_share

        try:
            self.mps = self._stack.enter_context(ledger.shared_mps())
            self.booking.note(mps_pipe_dir=self.mps.pipe_dir)
            self.pinned = pinned_env(self.share, mps_env=self.mps.env())
            self.sm_count = sm_count_at_share(self.share, self.pinned.env)
        except TunekitError:
            if not self.allow_unenforced:
                raise
            log.warning("UNENFORCED SHARE: MPS is not usable; measuring on the whole GPU")
            self.enforced = False
            self.pinned = pinned_env(self.share, enforced=False)

    def _open_within(self, outer: "ShareSession") -> None:
        from ..shares.mps import sm_count_at_share
        from ..shares.pinning import pinned_env

        if self.share.kind == "cpu":
            self.pinned = pinned_env(self.share, cores=outer.pinned.cores[:len(self.share.cpu_cores())])
            return
        self.mps, self.enforced = outer.mps, outer.enforced
        self.pinned = pinned_env(self.share, mps_env=self.mps.env() if self.mps else None, enforced=self.enforced)
        if self.enforced:
            self.sm_count = sm_count_at_share(self.share, self.pinned.env)

    def latency_process(self):
        """The process that times compiled models at this share (servers.latency.LatencyProcess),
        started at the first call and kept until the session closes."""
        from ..servers.latency import LatencyProcess

        if self._latency is None:
            self._latency = LatencyProcess(self.pinned)
            self._stack.callback(self._latency.close)  # before the daemon it runs under is stopped
        return self._latency

    def measure_latency(self, *, artifact: str, inputs: dict, repeats: int,
                        timeout_s: float = 600) -> tuple[dict, list]:
        """`artifact` timed at this share by the session's latency process: (info, outputs)."""
        return self.latency_process().measure(artifact=artifact, inputs=inputs, repeats=repeats, timeout_s=timeout_s)

    def __exit__(self, *exc) -> None:
        self._stack.close()  # the latency process, the daemon (stopped if no other job uses it), the booking

    def environment(self) -> dict:
        """What report.json records about where the measurements ran."""
        import tvm

        from ..shares.mps import gpu_name

        env = {"tvm_version": tvm.__version__, "python": platform.python_version(), "host": platform.node(),
               "cpu_count": os.cpu_count(), "share": self.share.label, "share_enforced": self.enforced}
        if self.share.kind == "gpu":
            env.update({"gpu_name": gpu_name(), "sm_count_at_share": self.sm_count,
                        "mps_pipe_dir_private": bool(self.mps and self.mps.user_id is not None),
                        "mps_daemon_started_here": bool(self.mps and self.mps.started_by_us)})
        else:
            env["cores_at_share"] = self.pinned.cores
        return env
