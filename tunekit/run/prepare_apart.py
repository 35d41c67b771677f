"""A fleet's models prepared at once, each in a process of its own, while the fleet's process loads them.

Preparing (fp16 conversion, fusion, legalizing) is mostly Python, and TOPI's tag scope is one per process, so
threads cannot do it side by side: four models took 56 s one after another on an H200 host, the longest of them
17 s (benchmarks/RESULTS.md, "A fleet's start"). A process of its own loads the ONNX file, prepares it for the
target and writes the module as TVM's JSON, which gives back the same module (its tasks' workload hashes too);
its log lines are said again here. Pipeline._jobs takes the module through `PreparedApart.take`.
"""
from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import os
import tempfile
from typing import Callable

from ..errors import RunFailed

log = logging.getLogger("tunekit")


class PreparedApart:
    """Preparations started in processes of their own; `take` waits for one and gives back its module."""

    def __init__(self, work_dir: str):
        self.work_dir = work_dir
        self._started: dict[tuple, tuple] = {}  # (name, target, precision) -> (its process pool, its future)

    def start(self, *, name: str, model: str, input_shapes: dict, target, precision: str) -> None:
        os.makedirs(self.work_dir, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=f"{name}-", suffix=".prepared.json", dir=self.work_dir)
        os.close(fd)
        # a pool each: a process that crashes takes only its own model with it
        pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        future = pool.submit(_prepare_here, model, dict(input_shapes), target.export(), precision, path)
        self._started[(name, str(target.export()), precision)] = (pool, future, path)

    def taker(self, name: str) -> Callable:
        """For Pipeline.prepared_ahead: (target, precision) -> (prepared module, precision), or None when no
        preparation of that was started here."""
        return lambda target, precision: self.take(name, target, precision)

    def take(self, name: str, target, precision: str):
        import tvm

        started = self._started.pop((name, str(target.export()), precision), None)
        if started is None:
            return None
        pool, future, path = started
        try:
            try:
                resolved, lines = future.result()
            except concurrent.futures.process.BrokenProcessPool:
                raise RunFailed(f"the process that prepared {name} died (a crash in TVM?); "
                                f"`tunekit check {name}` prepares it alone") from None
            for level, logger, text in lines:
                logging.getLogger(logger).log(level, "%s", text)
            with open(path) as f:
                return tvm.ir.load_json(f.read()), resolved
        finally:
            pool.shutdown(wait=False)
            _remove(path)

    def close(self) -> None:
        for pool, future, path in self._started.values():
            future.cancel()
            pool.shutdown(wait=True)
            _remove(path)
        self._started.clear()


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


class _Kept(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[tuple] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.name, record.getMessage()))


def _prepare_here(model: str, input_shapes: dict, target: dict, precision: str, path: str) -> tuple:
    """In the process of its own: (the precision it was prepared in, its log lines); the module in `path`."""
    import tvm
    from tvm.target import Target

    from ..frontend.precision import prepare
    from .session import load_model

    kept = _Kept()
    logger = logging.getLogger("tunekit")
    logger.addHandler(kept)
    logger.setLevel(logging.INFO)
    loaded = load_model(model, input_shapes)
    kept.lines.clear()  # the load's lines are the fleet process's own load's too
    prepared, resolved = prepare(loaded.mod, Target(target), precision=precision)
    with open(path + ".tmp", "w") as f:
        f.write(tvm.ir.save_json(prepared))
    os.replace(path + ".tmp", path)
    return resolved, kept.lines
