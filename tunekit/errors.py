"""User-facing errors: the CLI prints them as one line and exits non-zero.

Two kinds, because a CI pipeline reacts differently to them (docs/usage.md, "Exit codes"):
- TunekitError: the input or the command line is wrong (a missing file, a bad flag, a resume
  against another model). Exit code 2: fix the command, re-running it will not help.
- RunFailed: the input was fine but the run could not finish (every runner server gone, a
  tuning client that keeps dying, a latency measurement that crashed). Exit code 1: the
  records measured so far are kept and `--resume` continues.
"""
from __future__ import annotations


class TunekitError(Exception):
    """A problem with the user's input or environment, explained in one line (exit code 2)."""


class RunFailed(TunekitError):
    """The run itself failed after it started, explained in one line (exit code 1)."""


def error_line(error: str | None) -> str:
    """The line of a build or run error that says what went wrong: its last line that is not part of
    a traceback (TVM's errors end in "tvm.error.InternalError: Check failed: ..."), at most 200 chars."""
    lines = [ln.strip() for ln in str(error or "").splitlines() if ln.strip()]
    said = [ln for ln in lines if not ln.startswith(("File ", "Traceback", "^", "!!!"))]
    return (said or lines or ["(no error message)"])[-1][:200]


# what a process prints as it crashes natively (TVM FFI's SIGSEGV handler, CPython, the CUDA driver), ahead of
# a backtrace whose last line names only a frame
CRASH_MARKERS = ("Segfault encountered", "Fatal Python error", "Segmentation fault", "CUDA_ERROR_",
                 "illegal memory access", "misaligned address", "Aborted")


def crash_line(stderr: str | None) -> str:
    """The line of a dead process's stderr that says how it died: the first that names a native crash,
    else error_line's."""
    for line in str(stderr or "").splitlines():
        if any(marker in line for marker in CRASH_MARKERS):
            return line.strip().strip("!").strip()[:200]
    return error_line(stderr)


def one_line(text: str) -> str:
    """A message as one line: itself, or its first line and the line of the rest that says what went wrong."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else ""
    last = error_line("\n".join(lines[1:]))
    return lines[0] if last in lines[0] else f"{lines[0].rstrip(':')}: {last}"
