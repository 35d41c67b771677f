"""CUDA MPS: start (or reuse) a control daemon and pin processes to a percentage of the SMs.

A daemon tunekit starts gets a fresh private pipe/log directory: a stale pipe dir left by a
killed daemon makes the next start fail with error 805, so we never reuse one we did not make.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from ..errors import RunFailed, TunekitError
from .share import Share


def gpu_present() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return pynvml.nvmlDeviceGetCount() > 0
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return False


def require_gpu() -> None:
    """A GPU share needs a GPU, and NVRTC's Python bindings (builders compile each candidate's CUDA
    to a cubin with NVRTC): one clear line when either is missing."""
    import importlib.util

    if not gpu_present():
        raise TunekitError("--gpu-pct needs an NVIDIA GPU, and none was found (use --cpu-pct)")
    try:
        found = importlib.util.find_spec("cuda.bindings.nvrtc") is not None
    except ImportError:  # no `cuda` package at all
        found = False
    if not found:
        raise TunekitError("--gpu-pct needs NVRTC's Python bindings (cuda-bindings), which are not installed: "
                           "pip install 'tunekit[gpu]'")


def gpu_name(index: int = 0) -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(index))
            return name.decode() if isinstance(name, bytes) else name
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return None


MPS_CONTROL = "nvidia-cuda-mps-control"


def require_mps_control() -> None:
    if shutil.which(MPS_CONTROL) is None:
        raise TunekitError("CUDA MPS is not available (nvidia-cuda-mps-control not found); "
                           "use --allow-unenforced-share to tune without enforcing the share")


def _control_env(pipe_dir: str, log_dir: str | None) -> dict[str, str]:
    env = {**os.environ, "CUDA_MPS_PIPE_DIRECTORY": pipe_dir}
    if log_dir:
        env["CUDA_MPS_LOG_DIRECTORY"] = log_dir
    return env


class MPSDaemon:
    """Context manager: an MPS control daemon for the run (reused if the caller already has one).
    Several tunekit jobs share one through shares.ledger.shared_mps, which uses launch/answers/quit."""

    def __init__(self, *, pipe_dir: str | None = None, log_dir: str | None = None):
        self.pipe_dir = pipe_dir or os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
        self.log_dir = log_dir or os.environ.get("CUDA_MPS_LOG_DIRECTORY")
        self.started_by_us = False

    def env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir, "CUDA_MPS_LOG_DIRECTORY": self.log_dir}

    def start(self) -> "MPSDaemon":
        require_mps_control()
        if self.pipe_dir and os.path.exists(os.path.join(self.pipe_dir, "control")):
            return self  # the caller's daemon: reuse, never stop it
        return self.launch()

    def launch(self) -> "MPSDaemon":
        """A new daemon in a fresh private pipe/log dir (never one we did not make: see above)."""
        require_mps_control()
        root = tempfile.mkdtemp(prefix="tunekit-mps-")
        self.pipe_dir, self.log_dir = os.path.join(root, "pipe"), os.path.join(root, "log")
        os.makedirs(self.pipe_dir)
        os.makedirs(self.log_dir)
        # The daemon sees every GPU: a client's CUDA_VISIBLE_DEVICES is read relative to the daemon's
        # devices, so with all of them visible, physical indices (what Ray fleets and users set) mean
        # the same GPU in every job that shares this daemon.
        env = _control_env(self.pipe_dir, self.log_dir)
        env.pop("CUDA_VISIBLE_DEVICES", None)
        proc = subprocess.run([MPS_CONTROL, "-d"], env=env, capture_output=True, text=True, timeout=30)
        if proc.returncode != 0:
            raise RunFailed(f"could not start the CUDA MPS daemon: {proc.stderr.strip() or proc.stdout.strip()}")
        self.started_by_us = True
        time.sleep(0.5)
        return self

    def answers(self, *, timeout_s: float = 10.0) -> bool:
        """Whether a daemon is listening on our pipe dir (a killed one leaves a stale `control` behind)."""
        if not self.pipe_dir or not os.path.exists(os.path.join(self.pipe_dir, "control")):
            return False
        try:
            proc = subprocess.run([MPS_CONTROL], input="get_server_list\n",
                                  env=_control_env(self.pipe_dir, self.log_dir), capture_output=True, text=True,
                                  timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return proc.returncode == 0

    def quit(self) -> None:
        """Stop the daemon on our pipe dir, whoever started it."""
        try:
            subprocess.run([MPS_CONTROL], input="quit\n", env=_control_env(self.pipe_dir, self.log_dir),
                           capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            pass

    def stop(self) -> None:
        if not self.started_by_us:
            return
        self.quit()
        self.started_by_us = False

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


# The driver API through ctypes: a process that imported TVM for this took about 5 s on an H200 host (two shares'
# probes were 13 s of a fleet's start, benchmarks/RESULTS.md "A fleet's start"). The count is read in a context,
# as CUDA's runtime (and TVM) reads it: MPS limits the SMs of a context.
_SM_PROBE = """
import ctypes, json, sys
cuda = ctypes.CDLL("libcuda.so.1")
def check(status, call):
    if status:
        text = ctypes.c_char_p()
        cuda.cuGetErrorString(status, ctypes.byref(text))
        sys.exit(f"{call}: CUDA error {status} ({(text.value or b'').decode()})")
device, context, sm = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_int()
check(cuda.cuInit(0), "cuInit")
check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
check(cuda.cuDeviceGetAttribute(ctypes.byref(sm), 16, device), "cuDeviceGetAttribute")  # MULTIPROCESSOR_COUNT
print(json.dumps({"sm": sm.value}))
"""


def sm_count_at_share(share: Share, env: dict[str, str]) -> int:
    """SM count a fresh process sees at this share: proof the share took effect."""
    proc = subprocess.run([sys.executable, "-c", _SM_PROBE], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RunFailed(f"a process at {share.pct}% GPU could not start CUDA: {proc.stderr.strip()[-300:]}")
    return int(json.loads(proc.stdout.strip().splitlines()[-1])["sm"])
