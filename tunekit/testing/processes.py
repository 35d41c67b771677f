"""The real `tunekit` command in a subprocess, and the processes it leaves (or must not leave)."""
from __future__ import annotations

import subprocess
import sys
import time

import psutil

from .records import record_lines


def run_cli(*args, timeout: float = 900) -> subprocess.CompletedProcess:
    """Run `tunekit ARGS...` as a user would, to completion."""
    return subprocess.run([sys.executable, "-m", "tunekit.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def tune_process(model, out, *args, share: tuple = ("--cpu-pct", "50")) -> subprocess.Popen:
    """`tunekit tune MODEL --cpu-pct 50 --out OUT ARGS...` started in the background."""
    return subprocess.Popen([sys.executable, "-m", "tunekit.cli", "tune", str(model), *share, "--out", str(out),
                             *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_records(proc: subprocess.Popen, db_dir, n: int, *, timeout: float = 400) -> bool:
    """Wait until `db_dir` holds `n` trials. False when it timed out (the process is then killed);
    an AssertionError when the process ended first."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if len(record_lines(db_dir)) >= n:
            return True
        if proc.poll() is not None:
            raise AssertionError(f"tune exited early ({proc.returncode}): {proc.stderr.read()[-2000:]}")
        time.sleep(0.2)
    proc.kill()
    return False


def children_running(pid: int, fragment: str) -> list[psutil.Process]:
    """Descendants of `pid` whose command line contains `fragment` (e.g. "tunekit.servers.warm_server")."""
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    found = []
    for kid in kids:
        try:
            if fragment in " ".join(kid.cmdline()):
                found.append(kid)
        except psutil.Error:
            pass
    return found


def alive_after(procs: list[psutil.Process], timeout: float = 15) -> list[psutil.Process]:
    """Those of `procs` still running (not zombies) after waiting up to `timeout` s for them to go."""
    deadline = time.time() + timeout
    alive = procs
    while True:
        alive = [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        if not alive or time.time() >= deadline:
            return alive
        time.sleep(0.3)


def new_children(before: set[int], timeout: float = 0) -> list[str]:
    """Command lines of this process's descendants (not zombies) that are not in `before` (pids taken earlier),
    after waiting up to `timeout` s for them to go."""
    me = psutil.Process()
    deadline = time.time() + timeout
    while True:
        left = []
        for proc in me.children(recursive=True):
            try:
                if proc.pid not in before and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(" ".join(proc.cmdline())[:120])
            except psutil.NoSuchProcess:
                pass
        if not left or time.time() >= deadline:
            return left
        time.sleep(0.5)
