"""The real `tunekit` command in a subprocess, and the processes it leaves (or must not leave)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import psutil
import yaml

from .records import record_lines


# A small evolutionary search for the tests of everything but the search: with MetaSchedule's defaults, a test's
# run of a few trials spends most of its time searching (search=None keeps MetaSchedule's defaults).
QUICK_SEARCH = {"population": 16, "genetic_iters": 1, "init_samples": 8}


def with_search(args: list[str], search: dict | None) -> list[str]:
    """`tunekit tune` arguments whose config (--config, or the fleet file) also sets `search`; the keys the test's
    own file sets win. The merged file goes beside the test's file (its relative paths still hold), else --out's."""
    if not search or not args or args[0] != "tune" or "--gpu-pct" in args:  # GPU runs keep the CUDA defaults
        return args
    args = list(args)
    at = 1 if args[1].endswith((".yaml", ".yml")) else args.index("--config") + 1 if "--config" in args else None
    values = {}
    if at is not None:
        try:
            with open(args[at]) as fh:
                values = yaml.safe_load(fh) or {}
        except (OSError, ValueError, yaml.YAMLError):
            return args  # a test of a config tunekit must refuse gets it as it is
        if not isinstance(values, dict) or not isinstance(values.get("search", {}), (dict, type(None))):
            return args
        where = os.path.dirname(os.path.abspath(args[at]))
    else:
        where = os.path.dirname(os.path.abspath(args[args.index("--out") + 1])) if "--out" in args else None
    values["search"] = {**search, **(values.get("search") or {})}
    where = where if where and os.path.isdir(where) else None
    fd, path = tempfile.mkstemp(prefix="search-", suffix=".yaml", dir=where)
    with os.fdopen(fd, "w") as fh:
        yaml.safe_dump(values, fh)
    if at is None:
        return [*args, "--config", path]
    args[at] = path
    return args


def run_cli(*args, timeout: float = 900, search: dict | None = QUICK_SEARCH) -> subprocess.CompletedProcess:
    """Run `tunekit ARGS...` as a user would, to completion (`tune` with `search` in its config)."""
    return subprocess.run([sys.executable, "-m", "tunekit.cli", *with_search(list(map(str, args)), search)],
                          capture_output=True, text=True, timeout=timeout)


def tune_process(model, out, *args, share: tuple = ("--cpu-pct", "50"),
                 search: dict | None = QUICK_SEARCH) -> subprocess.Popen:
    """`tunekit tune MODEL --cpu-pct 50 --out OUT ARGS...` started in the background."""
    argv = with_search(["tune", str(model), *share, "--out", str(out), *map(str, args)], search)
    return subprocess.Popen([sys.executable, "-m", "tunekit.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


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
