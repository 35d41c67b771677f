"""A MetaSchedule runner that keeps one RPC session open per runner server.

Stock `RPCRunner` opens a new tracker request, RPC session and (with the stock server) a new
server process for every candidate. Here each server of the share's fleet is held by one
thread with one long-lived session: a candidate costs an upload, a dlopen and the timing.
Sessions go through TVM's tracker and RPC protocol, so stock servers work too (each of their
sessions is then one process, still reused across candidates).

Faults, and what becomes of the candidate that met them:
- the candidate fails on a healthy server (the session still answers): recorded failed;
- the server dies under it (crash, SIGKILL; the session no longer answers): the candidate goes
  back to the front of the queue and is measured once more, on the restarted or another server
  (the fleet supervisor restarts the dead one). Dying a second time with it, it is recorded
  failed: a candidate that crashes its server twice is the candidate's fault;
- it runs past `candidate_timeout_s`: recorded failed, and its server is stopped (`on_hang`) and
  replaced, since an RPC call cannot be interrupted from the client;
- no server can be reached for `servers_gone_timeout_s` while no session is held: the runner
  gives up (`fatal`, a ServersGone error naming the share and the timeout). Candidates not yet
  measured are answered `NOT_MEASURED` (never recorded: they were not tried), and the tuning
  loop stops after recording what was measured.
A thread holds a session before it takes a candidate from the queue, so a candidate never waits
on a thread that has no server while another thread has one (with `release_idle_sessions`, for
fleets shared by several clients, a thread takes a candidate first and returns the server to the
tracker when no candidate is waiting). Servers registered with the tracker but held by another
client are busy, not gone.

Measurements on one device take turns (shares/measure_lock.py): from upload to result a candidate
holds its device's lock, shared with every runner of this machine (other threads, clients, Ray
actors, tunekit processes). `measure_lock`: "auto" (GPU candidates only: servers on one GPU share
its memory bandwidth and L2, while CPU shares have disjoint cores), True or False. A candidate's
timeout starts once it holds the lock; the time spent waiting is `lock_wait_s` (per candidate in
`timings`, in total in `measure_lock_stats()`).
"""
from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import json
import logging
import os
import re
import socket
import struct
import threading
import time
from dataclasses import dataclass, field

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerInput, RunnerResult

from ..errors import RunFailed
from ..servers.input_fill import remote_fill
from ..servers.output_check import remote_compare

log = logging.getLogger("tunekit.runner")

NOT_MEASURED = "tunekit SessionRunner: not measured"
WRONG_OUTPUT = "tunekit SessionRunner: wrong output at the share"
# A candidate artifact that also holds a function of this name is checked before it is timed: both run on the same
# random inputs, and every argument must match within numerics.KERNEL_BOUND (kernels of another kind: issue 53)
REFERENCE = "tunekit_reference"
# ... and only the arguments it writes, where a file beside its library names them (written_args_path): a GEMM's
# weight need not cross the RPC link twice per candidate (GPT-2's LM head: 77 MB)
WRITTEN_ARGS_SUFFIX = ".written-args.json"


def written_args_path(artifact: str) -> str:
    return str(artifact) + WRITTEN_ARGS_SUFFIX


def mark_written_args(artifact: str, indices: list[int]) -> None:
    """Say which arguments the candidate `artifact` writes: its check compares those alone."""
    with open(written_args_path(artifact), "w") as fh:
        json.dump(sorted(indices), fh)


def _written_args(artifact: str) -> list[int] | None:
    try:
        with open(written_args_path(artifact)) as fh:
            return [int(i) for i in json.load(fh)]
    except FileNotFoundError:
        return None


MEASURE_LOCKS = (True, False, "auto")


def lock_name(setting, *, on_gpu: bool, device: str) -> str | None:
    """The measurement lock a candidate takes under `setting` (TuneConfig.measure_lock): None (no lock) or its
    device's. Never one per share: shares of a GPU measured side by side time up to 26% slower than alone
    (benchmarks/RESULTS.md, "a fleet on four H200s")."""
    if setting is False or (setting == "auto" and not on_gpu):
        return None
    return device


class ServersGone(RunFailed):
    """No runner server of the share could be reached for longer than servers_gone_timeout_s."""


def is_wrong_output(result) -> bool:
    """A candidate whose output differed from its reference's on the share's device: measured, never to be chosen."""
    return bool(result.error_msg) and WRONG_OUTPUT in str(result.error_msg)


def is_not_measured(result) -> bool:
    """A result for a candidate that never ran (the runner gave up or stopped): not a trial."""
    return bool(result.error_msg) and str(result.error_msg).startswith(NOT_MEASURED)


@dataclass
class RunTiming:
    load_s: float = 0.0   # upload + dlopen (+ device code load) on the server
    run_s: float = 0.0    # argument allocation + time evaluator
    ok: bool = False
    server: int = -1
    lock_wait_s: float = 0.0   # waiting for the device's measurement lock (not part of load_s or run_s)
    started_at: float = 0.0    # time.monotonic() when its measurement began (lock held) ...
    finished_at: float = 0.0   # ... and ended


@dataclass
class RunnerConfig:
    tracker_host: str = "127.0.0.1"
    tracker_port: int = 0
    key: str = ""
    sessions: int = 1                 # = runner servers: one session each
    number: int = 3                   # time evaluator: runs per repeat
    repeat: int = 1
    min_repeat_ms: int = 20
    candidate_timeout_s: float = 60.0  # one candidate; a hang fails it and its server is stopped (see on_hang)
    enable_cpu_cache_flush: bool = False
    # No session held and no server reachable for this long: the run stops (ServersGone).
    servers_gone_timeout_s: float = 120.0
    label: str = ""                    # the share, for messages (default: the tracker key)
    # Several tuning clients share the fleet: hold a session only while there is a candidate to
    # measure, and give the server back to the tracker when the queue runs dry.
    release_idle_sessions: bool = False
    # Shared secret the warm servers demand (see servers/warm_server.py); never logged.
    secret: bytes | None = field(default=None, repr=False)
    # One measurement at a time per device (module docstring): "auto" = GPU candidates only, True, False.
    measure_lock: bool | str = "auto"
    # The device the servers measure on, for the lock ("gpu1", "cpu"); None: a GPU named by the fleet's
    # key (a Ray fleet's ends in -gpu<index>), else this process's first visible GPU, or "cpu".
    lock_device: str | None = None


@derived_object
class _Future(PyRunnerFuture):
    def __init__(self, job: "_Job", runner: "SessionRunner", limit_s: float):
        super().__init__()
        self.job = job
        self.runner = runner
        self.limit_s = limit_s

    def done(self) -> bool:
        return self.job.future.done()

    def result(self) -> RunnerResult:
        # The runner resolves every job (measured, failed, or NOT_MEASURED when it gives up or stops);
        # the limit is only a safety net, and what it cuts short is not recorded as a failed trial.
        deadline = time.monotonic() + self.limit_s
        while True:
            try:
                return self.job.future.result(timeout=1.0)
            except concurrent.futures.TimeoutError:
                if time.monotonic() > deadline:
                    return RunnerResult(None, f"{NOT_MEASURED}: no result within {self.limit_s:.0f} s")


@dataclass
class _Job:
    runner_input: RunnerInput
    future: concurrent.futures.Future
    timing: RunTiming = field(default_factory=RunTiming)
    hung: bool = False
    server_deaths: int = 0  # how many servers died with this candidate on them


@derived_object
class SessionRunner(PyRunner):
    """Measure candidates on the share's servers through persistent RPC sessions."""

    def __init__(self, config: RunnerConfig, *, on_hang=None):
        """`on_hang(port)` is called when a candidate runs past its timeout on the server listening on
        `port`: an RPC call cannot be interrupted from the client, so the server must be stopped
        (the fleet's supervisor starts a new one). Without it a hung server stays lost to the run."""
        super().__init__()
        self.config = config
        self.on_hang = on_hang
        self.label = config.label or config.key
        self._busy: dict[int, tuple[float, int, "_Job"]] = {}  # thread -> (started, server port, job)
        self._queue: collections.deque = collections.deque()
        self._cond = threading.Condition()
        self._stopped = False
        self.fatal: ServersGone | None = None
        self._held = 0                        # threads holding a working session
        self._alive_at = time.monotonic()     # last time a session was known to work
        self.timings: dict[str, RunTiming] = {}  # artifact path -> timing (read by the tuning loop)
        # fault counts (report.json "faults")
        self.hangs = 0                 # candidates past their timeout (recorded failed, server replaced)
        self.session_failures = 0      # sessions dropped after a failure (any cause)
        self.server_losses = 0         # sessions whose server died under a candidate
        self.retried = 0               # candidates measured again after their server died
        self.retry_survived = 0        # ... and measured fine the second time
        self.failed_after_retry = 0    # ... and whose second server died too: recorded failed
        self.lock_wait_s = 0.0         # summed over candidates: waiting for the device's measurement lock
        self.locked_measurements = 0   # candidates measured holding the lock
        self._lock_devices: dict[str, str | None] = {}  # device type -> lock device (None: no lock)
        if config.measure_lock not in MEASURE_LOCKS:
            raise ValueError(f"measure_lock must be true, false or auto, not {config.measure_lock!r}")
        self._threads = [threading.Thread(target=self._serve, args=(i,), daemon=True, name=f"tunekit-session-{i}")
                         for i in range(max(1, config.sessions))]
        for thread in self._threads:
            thread.start()
        threading.Thread(target=self._watchdog, daemon=True, name="tunekit-session-watchdog").start()

    # ---- PyRunner ----
    def run(self, runner_inputs: list[RunnerInput]) -> list[_Future]:
        futures = []
        with self._cond:
            for runner_input in runner_inputs:
                job = _Job(runner_input, concurrent.futures.Future())
                self.timings[str(runner_input.artifact_path)] = job.timing
                if self.fatal is not None or self._stopped:
                    job.future.set_result(RunnerResult(None, f"{NOT_MEASURED}: {self.fatal or 'runner stopped'}"))
                else:
                    self._queue.append(job)
                # Queueing behind the others, one retry each, and waiting out a lost fleet: a safety net only.
                limit = (2 * self.config.candidate_timeout_s + 10) * (1 + len(self._queue)) \
                    + self.config.servers_gone_timeout_s + 60
                futures.append(_Future(job, self, limit))
            self._cond.notify_all()
        return futures

    def shutdown(self) -> None:
        with self._cond:
            self._stopped = True
            self._drain(f"{NOT_MEASURED}: runner stopped")
            self._cond.notify_all()

    def fault_counts(self) -> dict:
        return {"hung_candidates": self.hangs, "session_failures": self.session_failures,
                "sessions_lost_to_server_deaths": self.server_losses, "retried_candidates": self.retried,
                "retried_and_measured": self.retry_survived, "failed_after_retry": self.failed_after_retry}

    def measure_lock_stats(self) -> dict:
        """What the measurement lock cost (report phases): seconds waited, candidates measured under it."""
        with self._cond:
            return {"lock_wait_s": round(self.lock_wait_s, 3), "locked_measurements": self.locked_measurements}

    def _lock_device(self, device_type) -> str | None:
        """The device lock a candidate of `device_type` takes (lock_name), or None for no lock."""
        device_type = str(device_type)
        if device_type not in self._lock_devices:
            from ..shares.ledger import gpu_device

            on_gpu = device_type != "cpu"
            if self.config.lock_device:
                device = self.config.lock_device
            elif not on_gpu:
                device = "cpu"
            else:
                # A Ray GPU fleet's key is tunekit-<share>-<node>-gpu<physical index> (coordinator/
                # fleet_actor.py); the one-process fleet's (tunekit-<share>) servers use this process's GPU.
                named = re.search(r"-[^-]+-gpu(\d+)$", self.config.key)
                device = gpu_device(int(named.group(1)) if named else None)
            self._lock_devices[device_type] = lock_name(self.config.measure_lock, on_gpu=on_gpu, device=device)
        return self._lock_devices[device_type]

    def _device_turn(self, runner_input):
        """The device's measurement lock for this candidate (a context yielding the wait), or no lock."""
        from ..shares.measure_lock import measuring

        device = self._lock_device(runner_input.device_type)
        return measuring(device) if device is not None else contextlib.nullcontext(0.0)

    # ---- queue ----
    def _drain(self, message: str) -> None:
        while self._queue:
            job = self._queue.popleft()
            if not job.future.done():
                job.future.set_result(RunnerResult(None, message))

    def _take(self) -> "_Job | None":
        with self._cond:
            while not self._queue and not self._stopped and self.fatal is None:
                self._cond.wait(1.0)
            if self._stopped or self.fatal is not None:
                return None
            return self._queue.popleft()

    def _requeue_front(self, job: "_Job") -> None:
        with self._cond:
            if self._stopped or self.fatal is not None:
                job.future.set_result(RunnerResult(None, f"{NOT_MEASURED}: {self.fatal or 'runner stopped'}"))
                return
            self._queue.appendleft(job)
            self._cond.notify_all()

    def _give_up(self, error: ServersGone) -> None:
        with self._cond:
            if self.fatal is None:
                self.fatal = error
                log.info("%s", error)  # raised by the tuning loop; the CLI prints it once
            self._drain(f"{NOT_MEASURED}: {error}")
            self._cond.notify_all()

    def _watchdog(self) -> None:
        while not self._stopped and self.fatal is None:
            time.sleep(0.5)
            now = time.monotonic()
            for index, (started, port, job) in list(self._busy.items()):
                if now - started > self.config.candidate_timeout_s and not job.hung:
                    job.hung = True
                    self.hangs += 1
                    log.warning("a candidate ran past %.0f s on the server at port %d: stopping that server",
                                self.config.candidate_timeout_s, port)
                    if self.on_hang is not None:
                        self.on_hang(port)

    # ---- sessions ----
    def _request_server(self, timeout_s: float):
        """One tracker request, waiting at most `timeout_s` for a free server: (host, port, matchkey)."""
        from tvm.rpc import base

        sock = socket.create_connection((self.config.tracker_host, self.config.tracker_port), timeout=timeout_s)
        try:
            sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
            if struct.unpack("<i", base.recvall(sock, 4))[0] != base.RPC_TRACKER_MAGIC:
                raise RuntimeError("not an RPC tracker")
            data = json.dumps([base.TrackerCode.REQUEST, self.config.key, "", 1]).encode()
            sock.sendall(struct.pack("<i", len(data)) + data)
            size = struct.unpack("<i", base.recvall(sock, 4))[0]
            reply = json.loads(base.recvall(sock, size).decode())
        finally:
            sock.close()  # a request still pending in the tracker is dropped with the connection
        if reply[0] != base.TrackerCode.SUCCESS:
            raise RuntimeError(f"tracker refused the request: {reply!s}")
        host, port, matchkey = reply[1]
        return host, int(port), matchkey

    def _open_session(self):
        """A session with one server of the share: (session, port, random_fill), or None when the runner
        stops. Raises ServersGone when no session is held anywhere and none could be opened for
        servers_gone_timeout_s."""
        from tvm import rpc

        from ..servers.warm_server import client_key, redact

        last_error = "no runner server registered with the tracker"
        trying_since = time.monotonic()
        while True:
            if self._stopped or self.fatal is not None:
                return None
            try:
                host, port, matchkey = self._request_server(timeout_s=3.0)
                # session_timeout=0: the session lives as long as we hold it; timeouts are per candidate.
                session = rpc.connect(host, port, client_key(matchkey, self.config.secret), 0)
                random_fill = remote_fill(session)
                with self._cond:
                    self._held += 1
                    self._alive_at = time.monotonic()
                return session, port, random_fill
            except socket.timeout:
                last_error = "no free runner server registered with the tracker"
                if self._registered_servers() > 0:
                    # registered but held by another client (a shared fleet): busy, not gone
                    with self._cond:
                        self._alive_at = time.monotonic()
            except Exception as exc:  # tracker down, server gone between request and connect, key refused
                text = redact(" ".join(str(exc).strip().splitlines()[-2:]))[:300]
                if "cannot find server that matches key" in text:
                    text = ("a runner server refused the session (a wrong or missing RPC secret, or a stale "
                            "match key)")
                last_error = text
                time.sleep(0.5)
            with self._cond:
                # Only time spent trying counts (an idle client that gave back its session is not lost).
                lost_for = time.monotonic() - max(self._alive_at, trying_since)
                gone = self._held == 0 and lost_for > self.config.servers_gone_timeout_s
            if gone:
                raise ServersGone(
                    f"no runner server of share {self.label} could be reached for {lost_for:.0f} s "
                    f"(servers_gone_timeout_s = {self.config.servers_gone_timeout_s:g} s; last error: {last_error}); "
                    "the run stopped, every trial measured so far is kept in the records (continue with --resume)")

    def _registered_servers(self) -> int:
        """Servers of our key connected to the tracker (held by a client or not); 0 if it cannot be asked."""
        from tvm.rpc import base

        try:
            sock = socket.create_connection((self.config.tracker_host, self.config.tracker_port), timeout=3.0)
            try:
                sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
                base.recvall(sock, 4)
                data = json.dumps([base.TrackerCode.SUMMARY]).encode()
                sock.sendall(struct.pack("<i", len(data)) + data)
                size = struct.unpack("<i", base.recvall(sock, 4))[0]
                reply = json.loads(base.recvall(sock, size).decode())
            finally:
                sock.close()
        except Exception:
            return 0
        servers = reply[1].get("server_info", []) if isinstance(reply, list) and len(reply) > 1 else []
        return sum(1 for info in servers if info.get("key") == f"server:{self.config.key}")

    def _release_session(self) -> None:
        with self._cond:
            self._held -= 1
            self._alive_at = time.monotonic()

    def _drop_session(self) -> None:
        with self._cond:
            self._held -= 1
            self._alive_at = time.monotonic()  # the last moment a server was known to be there
        self.session_failures += 1

    @staticmethod
    def _session_answers(session) -> bool:
        try:
            session.get_function("tvm.rpc.server.workpath")  # one round trip
            return True
        except Exception:
            return False

    def _serve(self, index: int) -> None:
        lazy = self.config.release_idle_sessions
        held = None  # (session, port, random_fill)
        while True:
            if held is None and not lazy:
                try:
                    held = self._open_session()
                except ServersGone as exc:
                    self._give_up(exc)
                    return
                if held is None:
                    return
            job = self._take()
            if job is None:
                return
            if held is None:  # lazy: a session only for the candidates at hand
                try:
                    held = self._open_session()
                except ServersGone as exc:
                    self._requeue_front(job)
                    self._give_up(exc)
                    return
                if held is None:
                    job.future.set_result(RunnerResult(None, f"{NOT_MEASURED}: runner stopped"))
                    return
            if not self._measure_job(index, job, *held):
                held = None  # the session broke (and was counted): the next round opens a new one
            elif lazy:
                with self._cond:
                    idle = not self._queue
                if idle:
                    held = None  # give the server back to the tracker for the other clients
                    self._release_session()

    def _measure_job(self, index: int, job: "_Job", session, port, random_fill) -> bool:
        """Measure one candidate (or fail or requeue it). Returns whether the session is still usable."""
        job.timing.server = index
        try:
            with self._device_turn(job.runner_input) as waited:
                job.timing.lock_wait_s = waited
                if self._lock_device(job.runner_input.device_type) is not None:
                    with self._cond:
                        self.lock_wait_s += waited
                        self.locked_measurements += 1
                # The candidate's timeout starts now: waiting for another server's measurement is not a hang.
                self._busy[index] = (time.monotonic(), port, job)
                job.timing.started_at = time.monotonic()
                try:
                    costs = self._measure(session, random_fill, job)
                finally:
                    job.timing.finished_at = time.monotonic()
        except Exception as exc:
            message = " ".join(str(exc).strip().splitlines()[-3:])[:500]
            answers = not job.hung and self._session_answers(session)
            self._busy.pop(index, None)
            if job.hung:
                self._fail(job, f"ran past {self.config.candidate_timeout_s:.0f} s; its server was stopped "
                                f"and replaced ({message[:200]})")
                self._drop_session()
                return False
            if answers:
                # The candidate failed on a healthy server: its own fault, no retry.
                self._fail(job, message)
                if _session_broken(exc):
                    # e.g. a CUDA error: leave the session, so the server checks its device
                    # (--check-cuda) and exits if the context is broken.
                    self._drop_session()
                    return False
                return True
            # The server died with the candidate on it (or the connection broke).
            self._drop_session()
            self.server_losses += 1
            job.server_deaths += 1
            if job.server_deaths == 1:
                self.retried += 1
                log.warning("the runner server at port %s died while measuring a candidate; "
                            "measuring it once more (%s)", port, message[:200])
                self._requeue_front(job)
            else:
                self.failed_after_retry += 1
                self._fail(job, f"its server died twice while measuring it (the candidate's fault): {message}")
            return False
        self._busy.pop(index, None)
        with self._cond:
            self._alive_at = time.monotonic()
        if job.server_deaths:
            self.retry_survived += 1
        job.timing.ok = True
        job.future.set_result(RunnerResult([float(c) for c in costs], None))
        return True

    @staticmethod
    def _fail(job: "_Job", message: str) -> None:
        if not job.future.done():
            job.future.set_result(RunnerResult(None, f"tunekit SessionRunner: {message}"))

    def _measure(self, session, random_fill, job: _Job) -> list[float]:
        import tvm

        runner_input = job.runner_input
        artifact = str(runner_input.artifact_path)
        remote_name = os.path.basename(artifact)
        started = time.perf_counter()
        session.upload(artifact, remote_name)
        rt_mod = session.load_module(remote_name)
        device = session.device(str(runner_input.device_type), 0)
        loaded = time.perf_counter()
        args = []
        for info in runner_input.args_info:
            _kind, dtype, shape = info.as_json()
            tensor = tvm.runtime.empty(shape=shape, dtype=dtype, device=device)
            if str(dtype).startswith(("int", "uint")):
                # Integer arguments are often indices (take/gather of an embedding): random values
                # are out of range, the kernel reads far outside its table and takes the server's
                # process (or CUDA context) down. Zero is a valid index into any non-empty table.
                tensor.copyfrom(np.zeros(shape, dtype=dtype))
            else:
                random_fill(tensor)
            args.append(tensor)
        if rt_mod.implements_function(REFERENCE):
            _check_against_reference(rt_mod, args, device, written=_written_args(artifact),
                                     compare_remote=remote_compare(session))
        evaluator = rt_mod.time_evaluator(rt_mod.entry_name, device, number=self.config.number,
                                          repeat=self.config.repeat, min_repeat_ms=self.config.min_repeat_ms,
                                          f_preproc="cache_flush_cpu_non_first_arg"
                                          if self.config.enable_cpu_cache_flush else "")
        device.sync()
        costs = list(evaluator(*args).results)
        del args, rt_mod
        session.remove(remote_name)
        done = time.perf_counter()
        job.timing.load_s, job.timing.run_s = loaded - started, done - loaded
        return costs


class WrongOutput(Exception):
    """The candidate ran but its output differs from its reference's (a healthy server: the candidate's fault)."""


def _check_against_reference(rt_mod, args: list, device, *, written: list[int] | None, compare_remote=None) -> None:
    """Run the reference on `args` and the candidate on copies of them (outputs still holding the random fill, so a
    candidate that writes nothing differs too); every argument (of `written`, where known) must then match within
    numerics.KERNEL_BOUND. `compare_remote`: servers.output_check's, which compares on the server (else the tensors
    are copied here)."""
    import tvm

    from ..numerics import KERNEL_BOUND, compare, within

    copies = []
    for arg in args:
        copy = tvm.runtime.empty(shape=arg.shape, dtype=arg.dtype, device=device)
        copy.copyfrom(arg)
        copies.append(copy)
    rt_mod[REFERENCE](*args)
    rt_mod[rt_mod.entry_name](*copies)
    device.sync()
    for i, (mine, theirs) in enumerate(zip(copies, args)):
        if not str(mine.dtype).startswith(("float", "bfloat")) or (written is not None and i not in written):
            continue
        row = compare_remote(mine, theirs) if compare_remote else compare(mine.numpy(), theirs.numpy())
        if not within([row], KERNEL_BOUND):
            nonfinite = (f" ({row['nonfinite']} values not finite, the reference's {row['reference_nonfinite']})"
                         if "nonfinite" in row else "")
            raise WrongOutput(f"{WRONG_OUTPUT}: argument {i} differs from the reference's by {row['max_rel_err']:.3g} "
                              f"(max rel error) with cosine {row['cosine']:.6f}{nonfinite}")


def _session_broken(exc: Exception) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return any(word in text for word in ("connection", "socket", "broken pipe", "closed", "eof",
                                         "cuda", "illegal", "timeout"))
