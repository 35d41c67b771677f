"""End-to-end latency of a compiled model at a share, measured in a process pinned to it.

`LatencyProcess` is that process, kept while a share's session is open (run.session.ShareSession):
started with the session, so its TVM import (and on a GPU its CUDA context under MPS) overlaps the
untuned model's compile, and reused for every artifact timed at the share: a run times up to 4
artifacts per share (untuned, tuned, tuned without CUDA graphs, the robust step's), and each new
process costs seconds.
"""
from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from ..errors import RunFailed, crash_line, error_line
from ..shares.pinning import PinnedEnv
from .latency_worker import READY, REPLY

# Up to `repeats` timed runs, but about this long at most (never under latency_worker.MIN_REPEATS runs):
# a model of a second per run on a small CPU share is timed 5 times, not 20 (tuning is what is slow).
MAX_TIMING_S = 6.0
START_TIMEOUT_S = 300.0


class LatencyFailed(RunFailed):
    """An artifact could not be timed: it failed to load or to run, crashed its worker or ran past the timeout."""


class LatencyProcess:
    """A latency worker (servers.latency_worker --serve) pinned to `pinned`'s share, started now and
    answering one timing at a time until `close()`. A worker that dies (an artifact crashed it) or
    hangs past a timing's timeout is killed, its error raised in one line, and the next timing
    starts a new one."""

    def __init__(self, pinned: PinnedEnv):
        self.pinned = pinned
        self.device = "cuda" if pinned.share.kind == "gpu" else "cpu"
        self.started = 0  # processes started, the first included (tests; a restart counts too)
        self._lock = threading.Lock()
        self._proc = None
        self._lines: queue.Queue | None = None
        self._stderr = None
        self._ready = False
        self._start()

    def _start(self) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+")
        self._proc = subprocess.Popen([sys.executable, "-m", "tunekit.servers.latency_worker", "--serve", self.device],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True,
                                      bufsize=1, **self.pinned.popen_kwargs())
        self._lines = queue.Queue()
        self._ready = False
        self.started += 1
        # stdout is read on a thread of its own so that every wait has a timeout
        threading.Thread(target=_pump, args=(self._proc.stdout, self._lines), daemon=True,
                         name=f"latency-{self.pinned.share.label}").start()

    @property
    def pid(self) -> int | None:
        """The worker's process id (None between a death and the next timing)."""
        return self._proc.pid if self._proc is not None else None

    def measure(self, *, artifact: str, inputs: dict[str, np.ndarray], repeats: int,
                timeout_s: float = 600) -> tuple[dict, list[np.ndarray]]:
        """Time `artifact` on `inputs` at the share: (info, outputs), info as latency_worker's."""
        with self._lock, tempfile.TemporaryDirectory(prefix="tunekit-lat-") as tmp:
            if self._proc is None or self._proc.poll() is not None:
                self._start()
            in_path, out_path = os.path.join(tmp, "in.npz"), os.path.join(tmp, "out.npz")
            np.savez(in_path, **inputs)  # npz keeps insertion order = the model's input order
            deadline = time.monotonic() + timeout_s
            if not self._ready:
                self._wait_for(READY, deadline=min(deadline, time.monotonic() + START_TIMEOUT_S), what="start")
                self._ready = True
            request = {"artifact": artifact, "inputs": in_path, "repeats": int(repeats), "outputs": out_path,
                       "max_timing_s": MAX_TIMING_S}
            try:
                self._proc.stdin.write(json.dumps(request) + "\n")
                self._proc.stdin.flush()
            except OSError:
                self._fail("died before it could take the request")
            reply = json.loads(self._wait_for(REPLY, deadline=deadline, what="timing")[len(REPLY):])
            if not reply["ok"]:
                if self.device == "cuda":  # a CUDA error can leave its context unusable: the next timing starts anew
                    self._stop()
                raise LatencyFailed(f"latency measurement at {self.pinned.share.label} failed: "
                                    f"{error_line(reply['error'])}")
            with np.load(out_path) as data:
                outputs = [data[k] for k in data.files]
        return reply["info"], outputs

    def _wait_for(self, prefix: str, *, deadline: float, what: str) -> str:
        """The worker's next stdout line that starts with `prefix` (other lines are TVM's or the
        model's prints), or a one-line error once it dies or the deadline passes."""
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self._fail(f"timed out ({what})")
            if line is None:
                self._fail("died")
            if line.startswith(prefix):
                return line.rstrip("\n")

    def _fail(self, why: str):
        proc = self._proc
        stderr = self._stop()
        if why == "died" and proc is not None and (proc.returncode or 0) < 0:  # a native crash: name its signal
            why = f"died ({_signal_name(-proc.returncode)})"
        raise LatencyFailed(f"latency measurement at {self.pinned.share.label} failed: the worker {why}"
                            + (f": {crash_line(stderr)}" if stderr else ""))

    def _stop(self) -> str:
        """Stop the worker; the end of what it wrote to stderr."""
        proc, self._proc = self._proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            for pipe in (proc.stdin, proc.stdout):
                try:
                    pipe.close()
                except OSError:
                    pass
        tail = ""
        if self._stderr is not None:
            self._stderr.seek(0)
            tail = self._stderr.read().strip()[-20000:]  # a native crash's banner precedes its backtrace
            self._stderr.close()
            self._stderr = None
        return tail

    def close(self) -> None:
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                try:
                    proc.stdin.close()  # the worker's loop ends at EOF
                    proc.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._stop()

    def __enter__(self) -> "LatencyProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _pump(stream, lines: queue.Queue) -> None:
    try:
        for line in stream:
            lines.put(line)
    except (OSError, ValueError):
        pass
    lines.put(None)  # EOF: the worker is gone


def measure_latency(*, artifact: str, inputs: dict[str, np.ndarray], pinned: PinnedEnv, repeats: int,
                    timeout_s: float = 600, process: LatencyProcess | None = None) -> tuple[dict, list[np.ndarray]]:
    """Time `artifact` at `pinned`'s share: in `process` (kept by the caller), else in a process
    started for this one timing."""
    if process is not None:
        return process.measure(artifact=artifact, inputs=inputs, repeats=repeats, timeout_s=timeout_s)
    with LatencyProcess(pinned) as once:
        return once.measure(artifact=artifact, inputs=inputs, repeats=repeats, timeout_s=timeout_s)
