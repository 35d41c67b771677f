"""A fleet's models prepared at once, each in a process of its own, while the fleet's process loads them.

Preparing (fp16 conversion, fusion, legalizing) is mostly Python, and TOPI's tag scope is one per process, so
threads cannot do it side by side: four models took 56 s one after another on an H200 host, the longest of them
17 s (benchmarks/RESULTS.md, "A fleet's start"). A process of its own (`python -m tunekit.run.prepare_apart
REQUEST`: not multiprocessing, which would run the caller's script again in it) loads the ONNX file, prepares it
for the target and writes the module as TVM's JSON, which gives back the same module (its tasks' workload hashes
too); its log lines are said again here. Pipeline._jobs takes the module through `PreparedApart.take`.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from typing import Callable

from ..errors import RunFailed, TunekitError

log = logging.getLogger("tunekit")


class PreparedApart:
    """Preparations started in processes of their own; `take` waits for one and gives back its module."""

    def __init__(self, work_dir: str):
        self.work_dir = work_dir
        self._started: dict[tuple, tuple] = {}  # (name, target, precision) -> (its process, its files' stem)

    def start(self, *, name: str, model: str, input_shapes: dict, target, precision: str) -> None:
        import tvm

        os.makedirs(self.work_dir, exist_ok=True)
        stem = tempfile.mkdtemp(prefix=f"{name}-prepared-", dir=self.work_dir)
        request = {"model": os.path.abspath(model), "input_shapes": dict(input_shapes), "precision": precision,
                   "target": tvm.ir.save_json(target), "module": os.path.join(stem, "module.json"),
                   "result": os.path.join(stem, "result.json")}
        with open(os.path.join(stem, "request.json"), "w") as f:
            json.dump(request, f)
        proc = subprocess.Popen([sys.executable, "-m", __name__, os.path.join(stem, "request.json")],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        self._started[(name, str(target.export()), precision)] = (proc, stem)

    def taker(self, name: str) -> Callable:
        """For Pipeline.prepared_ahead: (target, precision) -> (prepared module, precision), or None when no
        preparation of that was started here."""
        return lambda target, precision: self.take(name, target, precision)

    def take(self, name: str, target, precision: str):
        import tvm

        started = self._started.pop((name, str(target.export()), precision), None)
        if started is None:
            return None
        proc, stem = started
        try:
            proc.wait()
            try:
                with open(os.path.join(stem, "result.json")) as f:
                    result = json.load(f)
            except (OSError, ValueError):
                raise RunFailed(f"the process that prepared {name} died (exit {proc.returncode}: a crash in TVM?); "
                                f"`tunekit check` prepares it alone") from None
            for level, logger, text in result.get("lines", []):
                logging.getLogger(logger).log(level, "%s", text)
            if "error" in result:
                raise TunekitError(result["error"])
            with open(os.path.join(stem, "module.json")) as f:
                return tvm.ir.load_json(f.read()), result["precision"]
        finally:
            _remove(stem)

    def close(self) -> None:
        for proc, stem in self._started.values():
            proc.kill()
            proc.wait()
            _remove(stem)
        self._started.clear()


def _remove(stem: str) -> None:
    import shutil

    shutil.rmtree(stem, ignore_errors=True)


class _Kept(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[tuple] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((record.levelno, record.name, record.getMessage()))


def _prepare_here(request: dict) -> dict:
    """In the process of its own: {precision, lines} or {error, lines}; the module in request["module"]."""
    import tvm

    from ..errors import one_line
    from ..frontend.precision import prepare
    from .session import load_model

    kept = _Kept()
    logger = logging.getLogger("tunekit")
    logger.addHandler(kept)
    logger.setLevel(logging.INFO)
    try:
        loaded = load_model(request["model"], request["input_shapes"])
        kept.lines.clear()  # the load's lines are the fleet process's own load's too
        prepared, resolved = prepare(loaded.mod, tvm.ir.load_json(request["target"]), precision=request["precision"])
    except Exception as exc:  # said in one line where the model is taken, as a preparation there would say it
        text = one_line(str(exc)) if isinstance(exc, TunekitError) else f"{type(exc).__name__}: {one_line(str(exc))}"
        return {"error": text, "lines": kept.lines}
    with open(request["module"] + ".tmp", "w") as f:
        f.write(tvm.ir.save_json(prepared))
    os.replace(request["module"] + ".tmp", request["module"])
    return {"precision": resolved, "lines": kept.lines}


def main(request_path: str) -> int:
    with open(request_path) as f:
        request = json.load(f)
    result = _prepare_here(request)
    with open(request["result"] + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(request["result"] + ".tmp", request["result"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
