"""tunekit: tune a DNN's kernels for the share of the device it will run on.

Map of the package (docs/design.md has the full table):
  frontend/     ONNX -> Relax -> MetaSchedule tasks
  shares/       what a share is (GPU % under MPS, CPU cores) and how a process is pinned to it
  servers/      TVM RPC tracker and runner servers pinned to a share
  clients/      the tuning engine: build pool, measuring runner, scheduler, search loop
  run/          the tuning pipeline (once for every executor), the share session, the report
  coordinator/  the Ray executor: tasks sharded over tuning clients, fleets per share and device
  records/      one tuning database per share, its file format, run identity
  reports/      the evaluate matrix and plots, the several-shares comparison
  deploy/       use what you tuned: load() -> TunedModel, run, bench, the artifact metadata
  api.py        the Python API;  cli/  the `tunekit` command
  slo.py, profiling.py, evaluation.py   --slo-ms, profile / the knee, evaluate
  testing/      real fleets, kernels and record readers for tests and benchmarks
"""
from .config import CoordinatorConfig, FleetModel, TuneConfig
from .errors import RunFailed, TunekitError
from .results import EvalResult, FleetResult, ProfileResult, SharesResult, SloResult, TuneResult
from .shares.share import Share
from .readiness import CheckResult, check  # `tunekit check`; imports TVM only when it runs

__all__ = ["TuneConfig", "CoordinatorConfig", "FleetModel", "TunekitError", "RunFailed", "Share", "tune", "tune_shares",
           "tune_fleet", "FleetResult",
           "tune_for_slo", "compile_model", "compile_variants", "evaluate", "profile", "load", "bench", "TuneResult", "SharesResult",
           "SloResult", "EvalResult", "ProfileResult", "TunedModel", "BenchResult", "check", "CheckResult"]

_API = ("tune", "tune_shares", "tune_fleet", "tune_for_slo", "compile_model", "compile_variants", "evaluate", "profile")


def __getattr__(name):
    # The API functions import TVM (slow): loaded on first use, so `import tunekit` and
    # `tunekit --help` stay fast. Configs and result types above are plain dataclasses.
    if name in _API:
        from . import api

        return getattr(api, name)
    if name in ("load", "bench", "TunedModel", "BenchResult"):  # imports neither TVM nor torch until used
        from . import deploy

        return getattr(deploy, name)
    raise AttributeError(name)
