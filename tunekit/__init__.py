"""tunekit: tune a DNN's kernels for the share of the device it will run on.

Map of the package:
  frontend/  ONNX -> Relax -> MetaSchedule tasks
  shares/    what a share is (GPU % under MPS, CPU cores) and how a process is pinned to it
  servers/   TVM RPC tracker and runner servers pinned to a share
  clients/   the tuning client: builder, runner, cost model, search, progress
  coordinator/  Ray: tasks sharded over tuning clients, runner fleets per share and device, merges
  records/   one tuning database per (target, share)
  reports/   report.json, the evaluate matrix, the several-shares comparison
  api.py     the Python API (tune / tune_shares / tune_for_slo / compile_model / evaluate)
  slo.py     --slo-ms: the smallest share that meets a latency SLO
  profiling.py  untuned latency per share and its knee (profile; tune's "auto" share)
  cli.py     the `tunekit` command
"""
from .config import TuneConfig
from .errors import TunekitError
from .shares.share import Share

__all__ = ["TuneConfig", "TunekitError", "Share", "tune", "tune_shares", "tune_for_slo", "compile_model", "evaluate",
           "TuneResult", "SharesResult", "CoordinatorConfig", "profile"]


def __getattr__(name):
    # The API imports TVM (slow); keep `import tunekit` and `tunekit --help` fast.
    if name in ("tune", "tune_shares", "tune_for_slo", "compile_model", "evaluate", "TuneResult", "SharesResult"):
        from . import api

        return getattr(api, name)
    if name == "CoordinatorConfig":
        from .coordinator.coordinator import CoordinatorConfig

        return CoordinatorConfig
    if name == "profile":
        from .profiling import profile

        return profile
    raise AttributeError(name)
