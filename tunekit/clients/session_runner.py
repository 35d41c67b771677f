"""A MetaSchedule runner that keeps one RPC session open per runner server.

Stock `RPCRunner` opens a new tracker request, RPC session and (with the stock server) a new
server process for every candidate. Here each server of the share's fleet is held by one
thread with one long-lived session: a candidate costs an upload, a dlopen and the timing.
Sessions go through TVM's tracker and RPC protocol, so stock servers work too (each of their
sessions is then one process, still reused across candidates).

A failure that breaks the session (the server died, a kernel crashed the context) fails only
that candidate; the thread drops the session and requests a new one for the next candidate
(the fleet supervisor restarts a dead server meanwhile).
"""
from __future__ import annotations

import concurrent.futures
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field

from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.runner import PyRunner, PyRunnerFuture, RunnerInput, RunnerResult

log = logging.getLogger("tunekit.runner")


@dataclass
class RunTiming:
    load_s: float = 0.0   # upload + dlopen (+ device code load) on the server
    run_s: float = 0.0    # argument allocation + time evaluator
    ok: bool = False
    server: int = -1


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
    connect_timeout_s: float = 120.0   # waiting for a free server (e.g. while one restarts)
    enable_cpu_cache_flush: bool = False


@derived_object
class _Future(PyRunnerFuture):
    def __init__(self, future: concurrent.futures.Future, timeout_s: float):
        super().__init__()
        self.future = future
        self.timeout_s = timeout_s

    def done(self) -> bool:
        return self.future.done()

    def result(self) -> RunnerResult:
        try:
            return self.future.result(timeout=self.timeout_s)
        except concurrent.futures.TimeoutError:
            return RunnerResult(None, f"tunekit SessionRunner: no result within {self.timeout_s:.0f} s")


@dataclass
class _Job:
    runner_input: RunnerInput
    future: concurrent.futures.Future
    timing: RunTiming = field(default_factory=RunTiming)
    hung: bool = False


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
        self._busy: dict[int, tuple[float, int, "_Job"]] = {}  # thread -> (started, server port, job)
        self.hangs = 0
        self._jobs: "queue.Queue[_Job | None]" = queue.Queue()
        self._threads = [threading.Thread(target=self._serve, args=(i,), daemon=True, name=f"tunekit-session-{i}")
                         for i in range(max(1, config.sessions))]
        self.timings: dict[str, RunTiming] = {}  # artifact path -> timing (read by the tuning loop)
        self.session_failures = 0
        for thread in self._threads:
            thread.start()
        threading.Thread(target=self._watchdog, daemon=True, name="tunekit-session-watchdog").start()

    # ---- PyRunner ----
    def run(self, runner_inputs: list[RunnerInput]) -> list[_Future]:
        futures = []
        for runner_input in runner_inputs:
            job = _Job(runner_input, concurrent.futures.Future())
            self.timings[str(runner_input.artifact_path)] = job.timing
            self._jobs.put(job)
            # The caller waits at most: queueing behind the other candidates + its own timeout.
            futures.append(_Future(job.future, self.config.candidate_timeout_s * (1 + self._jobs.qsize())))
        return futures

    def shutdown(self) -> None:
        self._stopped = True
        for _ in self._threads:
            self._jobs.put(None)

    def _watchdog(self) -> None:
        while not getattr(self, "_stopped", False):
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

    # ---- one thread per server ----
    def _connect(self):
        """TrackerSession.request, keeping the server's port (to stop that server if it hangs)."""
        from tvm import rpc
        from tvm.rpc import base

        tracker = rpc.connect_tracker(self.config.tracker_host, self.config.tracker_port)
        last_error = None
        try:
            for _ in range(max(1, int(self.config.connect_timeout_s / 5))):
                try:
                    base.sendjson(tracker._sock, [base.TrackerCode.REQUEST, self.config.key, "", 1])
                    reply = base.recvjson(tracker._sock)
                    if reply[0] != base.TrackerCode.SUCCESS:
                        raise RuntimeError(f"tracker refused the request: {reply!s}")
                    host, port, match_key = reply[1]
                    # session_timeout=0: the session lives as long as we hold it; timeouts are per candidate.
                    return rpc.connect(host, port, match_key, 0), int(port)
                except (OSError, RuntimeError) as exc:
                    last_error = exc
                    time.sleep(1)
                    tracker.close()
                    tracker = rpc.connect_tracker(self.config.tracker_host, self.config.tracker_port)
        finally:
            tracker.close()
        raise RuntimeError(f"no runner server for key {self.config.key!r}: {last_error}")

    def _serve(self, index: int) -> None:
        session = None
        random_fill = None
        port = None
        while True:
            job = self._jobs.get()
            if job is None:
                return
            job.timing.server = index
            try:
                if session is None:
                    session, port = self._connect()
                    random_fill = session.get_function("tvm.contrib.random.random_fill_for_measure")
                self._busy[index] = (time.monotonic(), port, job)
                try:
                    costs = self._measure(session, random_fill, job)
                finally:
                    self._busy.pop(index, None)
                job.timing.ok = True
                job.future.set_result(RunnerResult([float(c) for c in costs], None))
            except Exception as exc:  # the candidate failed; the session may be gone with it
                message = " ".join(str(exc).strip().splitlines()[-3:])[:500]
                if job.hung:
                    message = (f"ran past {self.config.candidate_timeout_s:.0f} s; its server was stopped "
                               f"and replaced ({message[:200]})")
                job.future.set_result(RunnerResult(None, f"tunekit SessionRunner: {message}"))
                if job.hung or _session_broken(exc):
                    self.session_failures += 1
                    session = random_fill = None

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
            random_fill(tensor)
            args.append(tensor)
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


def _session_broken(exc: Exception) -> bool:
    text = f"{type(exc).__name__} {exc}".lower()
    return any(word in text for word in ("connection", "socket", "broken pipe", "rpc", "closed", "eof",
                                         "cuda", "illegal", "timeout"))
