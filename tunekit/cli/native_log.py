"""TVM's C++ log lines off the terminal, into a file (every command, unless --debug).

TVM's LOG(WARNING) writes straight to the process's fd 2, past Python's logging and its levels; TVM 0.27
has no switch for it (it reads only TVM_LOG_DEBUG). A GPU tune prints dozens of lines such as "Trace
replay failed with ScheduleError" from the evolutionary search, and BERT's import topi's "Fast mode
segfaults when there are out-of-bounds indices", across the progress bar. None of them is something a
user can act on.

So fd 2 (and fd 1 where --json sent it to stderr) becomes a pipe that a thread reads: TVM's log lines
("[hh:mm:ss] file:line: Level: ...", and the indented lines that continue one) go to a file, everything
else to the real stderr as it comes. Python's own stderr (progress bar, errors, tracebacks) is pointed at
the real stderr directly, so nothing of ours waits in the pipe. The processes tunekit starts (build
workers, servers) inherit the pipe and are filtered the same way. At exit one line names the file.
"""
from __future__ import annotations

import os
import re
import sys
import tempfile
import threading

LOG_NAME = "tvm-native.log"
# TVM's LogMessage prefix: "[14:51:08] /project/src/relax/ir/block_builder.cc:67: "
_TVM_LINE = re.compile(rb"^\[\d\d:\d\d:\d\d\] \S+:\d+: ")
_MAX_PENDING = 20_000  # lines kept in memory until the file is known (a command's first seconds)

_active: "NativeLog | None" = None


class NativeLog:
    def __init__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self._real = os.dup(2)
        read_end, write_end = os.pipe()
        self._pipe_id = _file_id(write_end)
        os.dup2(write_end, 2)
        os.close(write_end)
        sys.stderr = open(os.dup(self._real), "w", buffering=1, encoding=getattr(sys.stderr, "encoding", None)
                          or "utf-8", errors="backslashreplace")
        self._lock = threading.Lock()
        self._pending: list[bytes] = []
        self._file = None
        self.path: str | None = None
        self.lines = 0
        self._thread = threading.Thread(target=self._pump, args=(read_end,), name="tunekit-native-log", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ the pipe's reader
    def _pump(self, read_end: int) -> None:
        continuing, partial = False, b""
        while True:
            try:
                chunk = os.read(read_end, 65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            partial += chunk
            *lines, partial = partial.split(b"\n")
            for line in lines:
                continuing = self._route(line + b"\n", continuing)
            # a partial line that cannot be TVM's (a child's prompt, a progress dot): pass it on now
            if partial and not partial.startswith(b"[") and not (continuing and partial[:1] in (b" ", b"\t")):
                self._forward(partial)
                partial, continuing = b"", False
        if partial:
            self._route(partial, continuing)
        os.close(read_end)

    def _route(self, line: bytes, continuing: bool) -> bool:
        """True when `line` is TVM's (so an indented next line continues it)."""
        try:
            if _TVM_LINE.match(line) or (continuing and line[:1] in (b" ", b"\t")):
                self._keep(line)
                return True
        except Exception:  # never let the reader die: a full pipe would block every writer
            pass
        self._forward(line)
        return False

    def _forward(self, data: bytes) -> None:
        try:
            os.write(self._real, data)
        except OSError:
            pass  # the real stderr is gone (a closed pipe): nothing to show it on

    def _keep(self, line: bytes) -> None:
        with self._lock:
            self.lines += 1
            if len(self._pending) < _MAX_PENDING:
                self._pending.append(line)
            self._flush_pending()

    def _flush_pending(self) -> None:
        """Write what is pending to the file once its path is known (opened at the first line: a command
        refused before its out dir exists must not create it for an empty log). Holds the lock."""
        if self.path is None or not self._pending:
            return
        try:
            if self._file is None:
                os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
                self._file = open(self.path, "ab")
            self._file.writelines(self._pending)
            self._file.flush()
        except OSError:  # no file after all: show the lines rather than lose them
            for line in self._pending:
                self._forward(line)
        self._pending.clear()

    # ------------------------------------------------------------ the main thread's side
    def write_to(self, path: str) -> None:
        """Keep the lines in `path` (appended), those so far included; the first path given stays."""
        with self._lock:
            if self.path is None:
                self.path = path
            self._flush_pending()

    def finish(self) -> None:
        """Stop filtering (every child is gone by now): drain the pipe, close the file, say where it is."""
        sys.stderr.flush()
        for fd in (1, 2):
            if _file_id(fd) == self._pipe_id:
                os.dup2(self._real, fd)
        self._thread.join(timeout=5)  # EOF once no process holds the pipe's write end
        self.write_to(os.path.join(tempfile.gettempdir(), f"tunekit-{os.getpid()}-{LOG_NAME}"))  # if none yet
        with self._lock:
            if self._file is not None:
                self._file.close()
            lines, path = self.lines, self.path
        if lines:
            print(f"tunekit: {lines} line(s) of TVM's C++ log are in {path} (--debug prints them)", file=sys.stderr)
        sys.stderr.flush()


def _file_id(fd: int):
    try:
        st = os.fstat(fd)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def install() -> NativeLog:
    global _active
    _active = NativeLog()
    return _active


def write_to(directory: str) -> None:
    """The command's out dir is known: keep TVM's log there (no-op when not filtering, e.g. --debug)."""
    if _active is not None:
        _active.write_to(os.path.join(directory, LOG_NAME))


def finish() -> None:
    global _active
    if _active is not None:
        active, _active = _active, None
        active.finish()
