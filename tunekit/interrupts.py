"""Ctrl-C and SIGTERM during a run.

Raising KeyboardInterrupt from the signal handler while TVM's C++ is calling back into Python
(the cost model inside the evolutionary search, a PyBuilder/PyRunner) can end in std::terminate
and a segfault instead of a clean stop (seen in the Ctrl-C test). While the tuning loop runs, the
first signal therefore only asks it to stop: it finishes collecting the batch in flight, the run
unwinds through every `with` (servers, tracker, MPS daemon, build workers) and the records keep
every measured trial. A second signal, or one outside the loop, interrupts at once.
"""
from __future__ import annotations

import contextlib

_state = {"requested": False, "cooperative": 0}


def request_stop() -> None:
    """Called by the signal handler."""
    if _state["cooperative"] and not _state["requested"]:
        _state["requested"] = True
        return
    _state["requested"] = True
    raise KeyboardInterrupt


def stop_requested() -> bool:
    return _state["requested"]


@contextlib.contextmanager
def cooperative():
    """A section that polls stop_requested() itself; on leaving it, a requested stop is raised."""
    _state["cooperative"] += 1
    try:
        yield
    finally:
        _state["cooperative"] -= 1
    if _state["requested"]:
        raise KeyboardInterrupt
