"""How a runner server process is started: tunekit's warm server or TVM's stock one.

`ServerLauncher.create(kind)` takes a name or a launcher, as MetaSchedule's `Runner.create` does.
"""
from __future__ import annotations

import sys

from ..errors import TunekitError


class ServerLauncher:
    name = ""
    checks_secret = False  # whether its servers demand the RPC secret before loading code
    starts_before_tracker = False  # whether its servers may start before the tracker listens (they retry quickly)
    takes_socket = False  # whether its servers serve a listening socket the fleet's process bound (`listen_fd`)

    def command(self, *, tracker: str, key: str, host: str, port: int, gpu: bool,
                listen_fd: int | None = None) -> list[str]:
        raise NotImplementedError

    @staticmethod
    def create(kind: "str | ServerLauncher") -> "ServerLauncher":
        if isinstance(kind, ServerLauncher):
            return kind
        launchers = {"warm": WarmServerLauncher, "stock": StockServerLauncher}
        if kind not in launchers:
            raise TunekitError(f"server mode must be one of {tuple(launchers)}, not {kind!r}")
        return launchers[kind]()


class WarmServerLauncher(ServerLauncher):
    """tunekit's in-process server: the CUDA context survives across sessions (servers.warm_server)."""

    name = "warm"
    checks_secret = True
    starts_before_tracker = True
    takes_socket = True

    def command(self, *, tracker, key, host, port, gpu, listen_fd=None):
        cmd = [sys.executable, "-m", "tunekit.servers.warm_server", "--tracker", tracker, "--key", key,
               "--host", host, "--port", str(port)]
        cmd += [] if listen_fd is None else ["--listen-fd", str(listen_fd)]
        return cmd + ["--check-cuda"] if gpu else cmd


class StockServerLauncher(ServerLauncher):
    """tvm.exec.rpc_server: a new process per session; the baseline. It cannot check a secret."""

    name = "stock"

    def command(self, *, tracker, key, host, port, gpu, listen_fd=None):
        cmd = [sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", tracker, "--key", key, "--host", host,
               "--port", str(port), "--port-end", str(port + 1)]
        return cmd + ["--no-fork"] if gpu else cmd  # fork mode fails CUDA init
