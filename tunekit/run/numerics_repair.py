"""A tuned build past the numerics bound, when the untuned build is within it: some task's best record computes
the wrong thing (or does not build, or fails or hangs when the model runs). Find those records by group testing over the applied workloads (build with
half of them, check the outputs, recurse into the half that fails) and leave their tasks on the untuned kernel,
so one wrong kernel costs that task its tuning, not the run its artifact.

A run with c broken records among n applied ones costs about 2 c log2(n) extra builds; it happens only when
the tuned build was refused. The two halves of a set are built at once (`prebuild`): a build is mostly TVM's C++,
which runs beside another on a second core, and the halves' timings then follow one another."""
from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import os
from typing import Callable

log = logging.getLogger(__name__)


def broken_workloads(keys: list[str], passes: Callable[[list[str]], bool], *,
                     time_left: Callable[[], float] = lambda: float("inf"),
                     prebuild: Callable[[list[list[str]]], None] | None = None) -> list[str]:
    """The smallest set found of `keys` whose records break the build; `keys` together must fail `passes`
    (a build with only those records applied). When no part of a failing set fails alone, the set is returned
    whole: its records break the model only together. Once `time_left()` is <= 0, a set not yet searched is
    returned whole (a model whose probe builds are slow, with many broken records, keeps more tasks untuned
    rather than taking hours). `prebuild(parts)`, where given, starts the builds of both halves before the first
    is checked."""
    if len(keys) <= 1:
        return list(keys)
    half = len(keys) // 2
    parts = [keys[:half], keys[half:]]
    if prebuild is not None and time_left() > 0:
        prebuild(parts)
    broken = []
    for part in parts:
        if time_left() <= 0:
            broken += part  # not searched: left out whole
        elif not passes(part):
            broken += broken_workloads(part, passes, time_left=time_left, prebuild=prebuild)
    return broken or list(keys)


class ProbeBuilds:
    """The probe builds of record sets, at most two at once: `build(keys, path)` writes the build of the records
    of `keys` to `path`. A set asked for by `prebuild` is built in the background; `take` waits for it (or builds it
    now) and gives its path, or raises the build's error. Every probe file is removed once used, or at `close`."""

    def __init__(self, build: Callable[[list[str], str], None], *, work_dir: str):
        self._build = build
        self._dir = work_dir
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="tunekit-probe")
        self._futures: dict[tuple, concurrent.futures.Future] = {}

    def _path(self, keys: list[str]) -> str:
        return os.path.join(self._dir, f"numerics-probe-{hashlib.sha1(repr(keys).encode()).hexdigest()[:12]}.so")

    def _write(self, keys: list[str]) -> str:
        path = self._path(keys)
        self._build(keys, path)
        return path

    def prebuild(self, parts: list[list[str]]) -> None:
        for part in parts:
            self._futures.setdefault(tuple(part), self._pool.submit(self._write, part))

    def take(self, keys: list[str]) -> str:
        future = self._futures.pop(tuple(keys), None)
        return future.result() if future is not None else self._write(keys)

    def discard(self, keys: list[str]) -> None:
        try:
            os.remove(self._path(keys))
        except OSError:
            pass

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        for keys in list(self._futures):
            self.discard(list(keys))
        self._futures.clear()


def mark_fallbacks(tasks: list[dict], broken: list[str], why: str) -> None:
    """Report rows: each broken workload's task kept its untuned kernel (tasks[].fallback), and why."""
    for row in tasks:
        if row.get("workload_hash") in broken:
            row["record_applied"] = False
            row["fallback"] = f"its tuned kernel broke the model: {why}"
