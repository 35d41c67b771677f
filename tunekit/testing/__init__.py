"""Real parts for tests and benchmarks (no mocks): runner fleets on free loopback ports, small TVM
kernels (including ones that crash or hang their server), record readers and a `tunekit`
subprocess helper. The counterpart of `optuna/testing` and MetaSchedule's `testing/local_rpc.py`.

Imports TVM: use it from tests and benchmarks, never from tunekit itself.
"""
from .fleet import build_inputs, local_fleet, session_runner
from .kernels import add_one_module, checked_library, crash_module, hang_module, pass_failure_module, slow_module, take_module
from .processes import QUICK_SEARCH, alive_after, children_running, new_children, run_cli, tune_process, wait_for_records
from .records import distinct, record_keys, record_lines, shard_dirs

__all__ = ["local_fleet", "session_runner", "build_inputs", "add_one_module", "checked_library", "crash_module", "hang_module",
           "pass_failure_module", "slow_module", "take_module", "QUICK_SEARCH", "run_cli", "tune_process", "wait_for_records", "children_running",
           "alive_after", "new_children", "record_lines", "record_keys", "distinct", "shard_dirs"]
