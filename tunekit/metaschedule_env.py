"""What MetaSchedule needs set up in a process: the tensor intrinsics of the target only, and its logging.

Below clients/ and records/ (both parse traces that name intrinsics), so neither reaches into the other for it.

`TuneContext()` runs `import tvm.s_tir.tensor_intrin`, which parses the TVMScript of every
intrinsic of every backend: 24 s on the 2-core CI machine, 21 s of it CUDA's (mma/wmma), which an
LLVM target never uses. Stock MetaSchedule pays that in the main process and again in every
LocalBuilder worker for every batch. Registering the package as a namespace and importing just
the target's module keeps every name the schedule rules look up and skips the rest.
"""
from __future__ import annotations

import contextlib
import importlib
import os
import sys
import types

_PACKAGE = "tvm.s_tir.tensor_intrin"
_BY_TARGET_KIND = {"cuda": ("cuda",), "llvm": ("x86", "arm_cpu")}
_CONSOLE_LEVEL: int | None = None  # MetaSchedule's console level (prepare_metaschedule_logging)


def prepare_metaschedule_logging() -> None:
    """MetaSchedule re-runs logging.dictConfig for every set of TuneContexts and lists the handlers
    already on its logger by name; a handler without a name (pytest's log capture, a CI pipeline's
    own) makes it fail with "'NoneType' object has no attribute 'format'" on the second run in one
    process. Such handlers would be dropped by that dictConfig anyway: drop them first."""
    import logging

    ms_logger = logging.getLogger("tvm.s_tir.meta_schedule")
    for handler in list(ms_logger.handlers):
        if not handler.get_name():
            ms_logger.removeHandler(handler)
    # MetaSchedule gives its console handler the level its logger has each time it makes a set of
    # TuneContexts, DEBUG if unset: every XGBoost round on the user's terminal (its log files under
    # <out>/work/logs keep them). Its dictConfig then leaves that logger at DEBUG, so the second set
    # (another share's, a client's next round) would print them: the level is set again before each
    # set, to what the user had set before tunekit first ran, else WARNING.
    global _CONSOLE_LEVEL
    if _CONSOLE_LEVEL is None:
        _CONSOLE_LEVEL = ms_logger.level if ms_logger.level != logging.NOTSET else logging.WARNING
    ms_logger.setLevel(_CONSOLE_LEVEL)


def import_for_target(kind: str) -> None:
    import tvm.s_tir

    package = sys.modules.get(_PACKAGE)
    if package is None:
        package = types.ModuleType(_PACKAGE)
        package.__path__ = [os.path.join(os.path.dirname(tvm.s_tir.__file__), "tensor_intrin")]
        package.__package__ = _PACKAGE
        sys.modules[_PACKAGE] = package
        tvm.s_tir.tensor_intrin = package
    with _lazy_frame_stacks():
        for module in _BY_TARGET_KIND.get(kind, ()):
            importlib.import_module(f"{_PACKAGE}.{module}")


class _LazyFrameStack:
    """What `inspect.stack()` returns (index, slice, len, iteration), with each FrameInfo made when it is
    read. TVMScript's `T.prim_func` takes the whole stack of its caller and reads only a frame or two of
    it; `inspect.stack()` reads every frame's source line, and each read scans `sys.modules`. That was most
    of parsing the CUDA tensor intrinsics (benchmarks/RESULTS.md, "intrinsics import"; the same intrinsics
    registered: tests/test_metaschedule_env.py), and the main process and every build worker parse them."""

    def __init__(self, frame, context: int):
        self._frames, self._context, self._infos = [], context, {}
        while frame is not None:
            self._frames.append(frame)
            frame = frame.f_back

    def __len__(self) -> int:
        return len(self._frames)

    def _info(self, index: int):
        import inspect

        if index not in self._infos:
            frame = self._frames[index]
            where = inspect.getframeinfo(frame, self._context)
            positions = {"positions": where.positions} if hasattr(where, "positions") else {}  # Python 3.11+
            self._infos[index] = inspect.FrameInfo(frame, *where, **positions)
        return self._infos[index]

    def __getitem__(self, key):
        if isinstance(key, slice):
            return [self._info(i) for i in range(*key.indices(len(self._frames)))]
        index = key + len(self._frames) if key < 0 else key
        if not 0 <= index < len(self._frames):
            raise IndexError(key)
        return self._info(index)

    def __iter__(self):
        return (self._info(i) for i in range(len(self._frames)))


class _InspectWithLazyStack(types.ModuleType):
    """`inspect` as TVMScript's prim_func parser sees it while the intrinsics are imported."""

    def __init__(self, real):
        super().__init__(real.__name__)
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    @staticmethod
    def stack(context: int = 1):
        return _LazyFrameStack(sys._getframe(1), context)


@contextlib.contextmanager
def _lazy_frame_stacks():
    """Only the parser's own module sees the lazy stack, and only during the import."""
    import inspect

    from tvm.tirx.script.parser import entry

    before = entry.inspect
    entry.inspect = _InspectWithLazyStack(inspect)
    try:
        yield
    finally:
        entry.inspect = before
