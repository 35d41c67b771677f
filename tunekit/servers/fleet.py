"""Tracker + runner servers for one share, started on free ports and always stopped on exit."""
from __future__ import annotations

import atexit
import logging
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from ..errors import TunekitError
from ..shares.pinning import PinnedEnv
from .ports import free_port

log = logging.getLogger("tunekit.servers")

SERVER_MODES = ("warm", "stock")


@dataclass
class FleetConfig:
    servers: int = 1
    host: str = "127.0.0.1"
    # "warm": tunekit's in-process server (CUDA context survives across sessions);
    # "stock": tvm.exec.rpc_server (a new process per session), kept as the baseline.
    server_mode: str = "warm"
    start_timeout_s: float = 60.0


@dataclass
class RunnerFleet:
    key: str
    pinned: PinnedEnv
    config: FleetConfig = field(default_factory=FleetConfig)
    tracker_port: int | None = None
    restarts: int = 0
    _tracker: subprocess.Popen | None = None
    _servers: list = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __enter__(self) -> "RunnerFleet":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # ---- lifecycle ----
    def start(self) -> None:
        if self.config.server_mode not in SERVER_MODES:
            raise TunekitError(f"server mode must be one of {SERVER_MODES}, not {self.config.server_mode!r}")
        atexit.register(self.stop)
        self.tracker_port = free_port(self.config.host)
        self._tracker = subprocess.Popen(
            [sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", self.config.host,
             "--port", str(self.tracker_port), "--port-end", str(self.tracker_port + 1), "--silent"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_tracker()
        self._servers = [self._start_server() for _ in range(self.config.servers)]
        self._wait_ready()
        threading.Thread(target=self._supervise, daemon=True).start()

    def stop_server_on_port(self, port: int) -> bool:
        """Kill the server listening on `port` (a candidate hung it); the supervisor starts a new one."""
        for proc in list(self._servers):
            if getattr(proc, "tunekit_port", None) == port and proc.poll() is None:
                proc.kill()
                return True
        return False

    def _start_server(self) -> subprocess.Popen:
        port = free_port(self.config.host)
        tracker = f"{self.config.host}:{self.tracker_port}"
        if self.config.server_mode == "warm":
            cmd = [sys.executable, "-m", "tunekit.servers.warm_server", "--tracker", tracker,
                   "--key", self.key, "--host", self.config.host, "--port", str(port)]
            if self.pinned.share.kind == "gpu":
                cmd.append("--check-cuda")
        else:
            cmd = [sys.executable, "-m", "tvm.exec.rpc_server", "--tracker", tracker, "--key", self.key,
                   "--host", self.config.host, "--port", str(port), "--port-end", str(port + 1)]
            if self.pinned.share.kind == "gpu":
                cmd.append("--no-fork")  # fork mode fails CUDA init
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=self._server_log(),
                                **self.pinned.popen_kwargs())
        proc.tunekit_port = port
        return proc

    def _server_log(self):
        # Server stderr goes to a log file (not our terminal): kept for post-mortems of crashes.
        import tempfile

        if not hasattr(self, "_log_path"):
            self._log_path = tempfile.mkstemp(prefix=f"tunekit-{self.key}-", suffix=".log")[1]
        return open(self._log_path, "ab")

    def _wait_tracker(self) -> None:
        # Servers that find no tracker back off for 5 s: start them only once it listens.
        import socket

        deadline = time.time() + self.config.start_timeout_s
        while time.time() < deadline:
            if self._tracker.poll() is not None:
                raise TunekitError("the RPC tracker exited at start-up")
            try:
                socket.create_connection((self.config.host, self.tracker_port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise TunekitError("the RPC tracker did not start listening")

    def _wait_ready(self) -> None:
        deadline = time.time() + self.config.start_timeout_s
        while time.time() < deadline:
            if self._tracker.poll() is not None:
                raise TunekitError("the RPC tracker exited at start-up")
            if self.free_servers() >= self.config.servers:
                return
            time.sleep(0.3)
        raise TunekitError(f"runner servers did not register with the tracker within {self.config.start_timeout_s:.0f} s")

    def free_servers(self) -> int:
        from tvm import rpc

        try:
            summary = rpc.connect_tracker(self.config.host, self.tracker_port).summary()
        except Exception:
            return 0
        return sum(1 for info in summary.get("server_info", []) if info.get("key") == f"server:{self.key}")

    def idle_servers(self) -> int:
        """Servers waiting in the tracker's queue for a session (registered and not held by a client)."""
        from tvm import rpc

        try:
            summary = rpc.connect_tracker(self.config.host, self.tracker_port).summary()
        except Exception:
            return 0
        return int(summary.get("queue_info", {}).get(self.key, {}).get("free", 0))

    def _supervise(self) -> None:
        # A candidate that crashes a warm server takes the process with it: replace the server, keep the run.
        while not self._stop.wait(0.5):
            for i, proc in enumerate(self._servers):
                if proc.poll() is not None and not self._stop.is_set():
                    log.warning("runner server %d exited (code %s); restarting", i, proc.returncode)
                    self.restarts += 1
                    self._servers[i] = self._start_server()

    def stop(self) -> None:
        import psutil

        self._stop.set()
        # `tvm.exec.rpc_tracker` runs the tracker in a child process of its own: stop whole trees.
        descendants = []
        for proc in [*self._servers, self._tracker]:
            if proc is not None and proc.poll() is None:
                try:
                    descendants += psutil.Process(proc.pid).children(recursive=True)
                except psutil.Error:
                    pass
                proc.terminate()
        for child in descendants:
            try:
                child.terminate()
            except psutil.Error:
                pass
        psutil.wait_procs(descendants, timeout=5)
        for proc in [*self._servers, self._tracker]:
            if proc is not None:
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    proc.kill()
        self._servers = []
        self._tracker = None

    @property
    def server_pids(self) -> list[int]:
        return [p.pid for p in self._servers]
