"""Tracker + runner servers for one share, started on free ports and always stopped on exit.

The supervisor thread replaces a server that exited (a candidate crashed it, it was stopped for a
hung candidate, it was killed) and a tracker that exited (on the same port, so that servers and
clients find it again). A server that keeps dying right after its start is restarted with a
growing back-off (0.5 s .. 5 s); the runner decides when "no server for too long" ends the run
(RunnerConfig.servers_gone_timeout_s).

Security: everything listens on 127.0.0.1 unless FleetConfig.host says otherwise, and a
non-loopback host needs a shared secret (warm servers check it before any code is loaded;
stock servers cannot, so they are loopback-only). See docs/running.md, "Security".
"""
from __future__ import annotations

import atexit
import logging
import os
import select
import socket
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from ..errors import RunFailed, TunekitError
from ..shares.pinning import PinnedEnv
from .launcher import ServerLauncher
from .ports import free_port
from .warm_server import SECRET_ENV, is_loopback

log = logging.getLogger("tunekit.servers")

MIN_SECRET_CHARS = 16
_WILDCARDS = ("0.0.0.0", "::", "")


def load_rpc_secret(secret_file: str | None = None) -> bytes | None:
    """The shared RPC secret: the first line of `secret_file`, else env TUNEKIT_RPC_SECRET, else None.
    The secret is never logged or written anywhere by tunekit."""
    if secret_file:
        try:
            mode = os.stat(secret_file).st_mode
            with open(secret_file, "rb") as fh:
                text = fh.read(1 << 16).strip().split(b"\n")[0].strip()
        except OSError as exc:
            raise TunekitError(f"cannot read the RPC secret file {secret_file}: {exc.strerror or exc}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise TunekitError(f"the RPC secret file {secret_file} is readable by other users: chmod 600 it")
        source = secret_file
    else:
        text = os.environ.get(SECRET_ENV, "").strip().encode()
        source = SECRET_ENV
        if not text:
            return None
    if len(text) < MIN_SECRET_CHARS:
        raise TunekitError(f"the RPC secret from {source} is too short: use at least {MIN_SECRET_CHARS} "
                           "characters (e.g. `openssl rand -hex 32`)")
    return text


def check_listen(host: str, secret: bytes | None, server_mode: str) -> None:
    """Refuse a network-reachable tracker/servers that anyone could send code to."""
    if is_loopback(host):
        return
    if not ServerLauncher.create(server_mode).checks_secret:
        raise TunekitError(f"--listen-host {host}: stock servers (--server-mode stock) cannot check a secret "
                           "and run any code they are sent, so they listen on 127.0.0.1 only")
    if not secret:
        raise TunekitError(f"--listen-host {host} makes the runner servers reachable from the network, and TVM RPC "
                           f"runs any code it is sent: give a shared secret with --rpc-secret-file PATH or "
                           f"{SECRET_ENV} (or keep the default 127.0.0.1)")


def listen_secret(*, listen_host: str, secret_file: str | None, server_mode: str, engine: str = "tunekit") -> bytes | None:
    """The secret a run's fleet and runner use, checked before any work: a non-loopback listen host
    needs one (and warm servers); on loopback one is used when given. TVM's stock RPCRunner
    (--engine stock) cannot prove a secret, so it runs on loopback without one."""
    secret = load_rpc_secret(secret_file)
    check_listen(listen_host, secret, server_mode)
    if engine == "stock" and secret is not None:
        if not is_loopback(listen_host):
            raise TunekitError(f"--listen-host {listen_host}: --engine stock (TVM's RPCRunner) cannot send the RPC "
                               "secret; use --engine tunekit, or listen on 127.0.0.1")
        return None
    return secret


@dataclass
class FleetConfig:
    servers: int = 1
    host: str = "127.0.0.1"
    # "warm": tunekit's in-process server (CUDA context survives across sessions);
    # "stock": tvm.exec.rpc_server (a new process per session), kept as the baseline.
    server_mode: str = "warm"
    start_timeout_s: float = 60.0
    # Shared secret the warm servers demand from every client (required when `host` is not loopback).
    secret: bytes | None = field(default=None, repr=False)
    # Server logs (their stderr) go here: the run's <out>/work/logs (default: a temporary file).
    log_dir: str | None = None

    @property
    def connect_host(self) -> str:
        """Where local processes reach the tracker (a wildcard listen address is no address to dial)."""
        return "127.0.0.1" if self.host in _WILDCARDS else self.host


@dataclass
class RunnerFleet:
    key: str
    pinned: PinnedEnv
    config: FleetConfig = field(default_factory=FleetConfig)
    tracker_port: int | None = None
    restarts: int = 0          # replacement servers started
    deaths: int = 0            # server exits seen by the supervisor (crashes, kills, hung-candidate stops)
    restart_failures: int = 0  # replacements that could not even be started
    tracker_restarts: int = 0
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
        self._launcher = ServerLauncher.create(self.config.server_mode)
        check_listen(self.config.host, self.config.secret, self.config.server_mode)
        atexit.register(self.stop)
        self._tracker_socket = _listening_socket(self.config.host)
        self.tracker_port = self._tracker_socket.getsockname()[1]
        self._tracker = self._start_tracker(signal_ready=True)
        if self._launcher.starts_before_tracker:  # both import TVM: at once, not one after the other
            self._servers = [self._start_server() for _ in range(self.config.servers)]
            self._wait_tracker()
        else:
            self._wait_tracker()
            self._servers = [self._start_server() for _ in range(self.config.servers)]
        self._wait_ready()
        threading.Thread(target=self._supervise, daemon=True, name=f"tunekit-supervisor-{self.key}").start()

    def stop_server_on_port(self, port: int) -> bool:
        """Kill the server listening on `port` (a candidate hung it); the supervisor starts a new one."""
        for proc in list(self._servers):
            if getattr(proc, "tunekit_port", None) == port and proc.poll() is None:
                proc.kill()
                return True
        return False

    def _start_tracker(self, *, signal_ready: bool = False) -> subprocess.Popen:
        # Our own launcher around TVM's tracker: it runs in this child process (not in a PopenWorker
        # grandchild that outlives a SIGKILLed parent) and exits when its parent is gone. It serves the socket this
        # process listens on (_listening_socket) and says so on stdout (`signal_ready`: _wait_tracker reads it).
        fd = self._tracker_socket.fileno()
        with self._server_log() as log_file:  # the child has its own copy
            return subprocess.Popen([sys.executable, "-m", "tunekit.servers.fleet", "--tracker-fd", str(fd)],
                                    pass_fds=(fd,), stdout=subprocess.PIPE if signal_ready else subprocess.DEVNULL,
                                    stderr=log_file)

    def _start_server(self) -> subprocess.Popen:
        # A server that takes a socket gets it bound here, as the tracker does (_listening_socket): its port cannot be
        # taken before it listens. A stock server binds the port it is given.
        sock = _listening_socket(self.config.host) if self._launcher.takes_socket else None
        port = sock.getsockname()[1] if sock is not None else free_port(self.config.host)
        cmd = self._launcher.command(tracker=f"{self.config.connect_host}:{self.tracker_port}", key=self.key,
                                     host=self.config.host, port=port, gpu=self.pinned.share.kind == "gpu",
                                     listen_fd=None if sock is None else sock.fileno())
        kwargs = self.pinned.popen_kwargs()
        if sock is not None:
            kwargs["pass_fds"] = (sock.fileno(),)
        env = dict(kwargs.pop("env"))
        env.pop(SECRET_ENV, None)
        if self.config.secret and self._launcher.checks_secret:
            env[SECRET_ENV] = self.config.secret.decode()  # the environment, never argv (ps shows argv)
        try:
            with self._server_log() as log_file:
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log_file, env=env, **kwargs)
        finally:
            if sock is not None:
                sock.close()  # the server has its own copy
        proc.tunekit_port = port
        proc.tunekit_started = time.monotonic()
        return proc

    def _server_log(self):
        # Server stderr goes to a log file (not our terminal): kept for post-mortems of crashes.
        import tempfile

        if not hasattr(self, "_log_path"):
            if self.config.log_dir:
                os.makedirs(self.config.log_dir, exist_ok=True)
                self._log_path = os.path.join(self.config.log_dir, f"{self.key}-servers.log")
            else:
                self._log_path = tempfile.mkstemp(prefix=f"tunekit-{self.key}-", suffix=".log")[1]
        return open(self._log_path, "ab")

    @property
    def log_path(self) -> str | None:
        return getattr(self, "_log_path", None)

    def _wait_tracker(self) -> None:
        """Until the tracker serves its socket (it says so on stdout): a connection before then waits in the socket's
        backlog, and one to a tracker that died at start-up would wait there for good."""
        deadline = time.time() + self.config.start_timeout_s
        pipe = self._tracker.stdout
        try:
            while time.time() < deadline:
                if select.select([pipe], [], [], 0.1)[0] and pipe.readline().strip() == _READY:
                    return
                if self._tracker.poll() is not None:
                    raise RunFailed(f"the RPC tracker exited at start-up (exit code {self._tracker.returncode}; "
                                    f"its log: {self.log_path})")
            raise RunFailed("the RPC tracker did not start listening")
        finally:
            pipe.close()

    def _wait_ready(self) -> None:
        deadline = time.time() + self.config.start_timeout_s
        while time.time() < deadline:
            if self._tracker.poll() is not None:
                raise RunFailed("the RPC tracker exited at start-up")
            if self.registered_servers() >= self.config.servers:
                return
            time.sleep(0.3)
        raise RunFailed(f"runner servers did not register with the tracker within {self.config.start_timeout_s:.0f} s")

    def _summary(self) -> dict:
        from tvm import rpc

        try:
            return rpc.connect_tracker(self.config.connect_host, self.tracker_port).summary()
        except Exception:
            return {}

    def registered_servers(self) -> int:
        """Servers registered with the tracker (held by a client or not)."""
        summary = self._summary()
        return sum(1 for info in summary.get("server_info", []) if info.get("key") == f"server:{self.key}")

    def idle_servers(self) -> int:
        """Servers waiting in the tracker's queue for a session (registered and not held by a client)."""
        summary = self._summary()
        return int(summary.get("queue_info", {}).get(self.key, {}).get("free", 0))

    def _supervise(self) -> None:
        # A candidate that crashes a warm server takes the process with it: replace the server, keep the run.
        backoff: dict[int, float] = {}   # slot -> seconds to wait before the next start
        due: dict[int, float] = {}       # slot -> monotonic time of the next start
        while not self._stop.wait(0.5):
            try:
                if self._tracker is not None and self._tracker.poll() is not None and not self._stop.is_set():
                    log.warning("the RPC tracker exited (code %s); restarting it on port %d",
                                self._tracker.returncode, self.tracker_port)
                    self.tracker_restarts += 1
                    self._tracker = self._start_tracker()
                for i, proc in enumerate(list(self._servers)):
                    if self._stop.is_set():
                        return
                    if proc is not None and proc.poll() is None:
                        if time.monotonic() - proc.tunekit_started > 10:
                            backoff.pop(i, None)  # it stayed up: the next death restarts at once
                        continue
                    now = time.monotonic()
                    if proc is not None:  # just seen dead
                        self.deaths += 1
                        self._servers[i] = None
                        wait = backoff.get(i, 0.0)
                        due[i] = now + wait
                        backoff[i] = min(5.0, max(0.5, wait * 2))
                        if wait == 0:
                            log.warning("runner server %d exited (code %s); restarting", i, proc.returncode)
                        elif wait == 0.5:
                            log.warning("runner server %d keeps exiting right after its start (code %s); "
                                        "restarting with a back-off of up to 5 s", i, proc.returncode)
                        else:
                            log.info("runner server %d exited (code %s); restarting in %.1f s", i,
                                     proc.returncode, wait)
                    if now < due.get(i, 0.0):
                        continue
                    try:
                        self._servers[i] = self._start_server()
                        self.restarts += 1
                    except Exception as exc:  # e.g. out of processes or memory: try again later
                        self.restart_failures += 1
                        due[i] = now + backoff.get(i, 0.5)
                        log.warning("runner server %d could not be started: %s", i, exc)
            except Exception:  # the supervisor must outlive anything one round throws
                log.exception("runner fleet supervisor")

    def fault_counts(self) -> dict:
        return {"server_deaths": self.deaths, "server_restarts": self.restarts,
                "server_restart_failures": self.restart_failures, "tracker_restarts": self.tracker_restarts}

    def stop(self) -> None:
        import psutil

        self._stop.set()
        # Stop whole trees (a stock server forks a process per session).
        procs = [p for p in [*self._servers, self._tracker] if p is not None]
        descendants = []
        for proc in procs:
            if proc.poll() is None:
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
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
        self._servers = []
        self._tracker = None
        if getattr(self, "_tracker_socket", None) is not None:
            self._tracker_socket.close()
            self._tracker_socket = None

    @property
    def server_pids(self) -> list[int]:
        return [p.pid for p in self._servers if p is not None]


_READY = b"tracker ready"


def _listening_socket(host: str) -> socket.socket:
    """A socket bound to a port the OS picks and listening, in the fleet's own process, for the tracker or a warm
    server to serve (pass_fds): no other process can take the port between its choice and the server's bind (a tune
    started beside other jobs died of that: "the RPC tracker exited at start-up"). The fleet keeps the tracker's, so
    a restarted tracker serves the same socket, its port never free in between."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((host, 0))
    sock.listen(16)
    return sock


def _tracker_main(argv=None) -> None:
    """`python -m tunekit.servers.fleet --tracker-fd FD`: TVM's RPC tracker in this process, on the listening socket
    FD that the fleet's process passed it."""
    import argparse
    import secrets

    from tvm.rpc import tracker

    from .warm_server import exit_with_parent

    parser = argparse.ArgumentParser()
    parser.add_argument("--tracker-fd", type=int, required=True)
    args = parser.parse_args(argv)
    exit_with_parent()
    tracker.logger.setLevel(logging.ERROR)
    sock = socket.socket(fileno=args.tracker_fd)
    sys.stdout.buffer.write(_READY + b"\n")
    sys.stdout.flush()
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the fleet's process reads one line, then closes
    tracker._tracker_server(sock, secrets.token_hex(16))  # the STOP key: random, never used


if __name__ == "__main__":
    _tracker_main()
