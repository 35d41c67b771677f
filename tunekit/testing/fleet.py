"""A share's runner fleet on free 127.0.0.1 ports, and what measures on it."""
from __future__ import annotations

import contextlib

from ..servers.fleet import FleetConfig, RunnerFleet
from ..shares.pinning import pinned_env
from ..shares.share import Share


@contextlib.contextmanager
def local_fleet(key: str, *, share: Share | None = None, servers: int = 1, **config):
    """A tracker and `servers` runner servers pinned to `share` (default cpu50); stopped on exit.
    `config`: more FleetConfig fields (secret, host, server_mode, log_dir)."""
    fleet = RunnerFleet(key=key, pinned=pinned_env(share or Share("cpu", 50)),
                        config=FleetConfig(servers=servers, **config))
    with fleet:
        yield fleet


def session_runner(fleet: RunnerFleet, **config):
    """tunekit's SessionRunner on `fleet` (one session per server). `config`: more RunnerConfig fields."""
    from ..clients.session_runner import RunnerConfig, SessionRunner

    config.setdefault("sessions", fleet.config.servers)
    return SessionRunner(RunnerConfig(tracker_port=fleet.tracker_port, key=fleet.key, **config),
                         on_hang=fleet.stop_server_on_port)


def build_inputs(pool, mods: list, *, target=None) -> list:
    """Build each IRModule (its "main" PrimFunc) on `pool`; RunnerInputs ready for a CPU runner."""
    import tvm
    from tvm.s_tir.meta_schedule.arg_info import ArgInfo
    from tvm.s_tir.meta_schedule.builder import BuilderInput
    from tvm.s_tir.meta_schedule.runner import RunnerInput

    target = target or tvm.target.Target({"kind": "llvm"})
    built = pool.build([BuilderInput(mod, target) for mod in mods])
    errors = [b.error_msg for b in built if b.error_msg]
    if errors:
        raise AssertionError(f"build failed: {errors[0][:500]}")
    return [RunnerInput(b.artifact_path, "cpu", ArgInfo.from_prim_func(mod["main"])) for b, mod in zip(built, mods)]
