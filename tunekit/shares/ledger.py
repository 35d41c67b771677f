"""Who holds which share of each device on this machine, across tunekit processes (the ledger).

Several tunekit jobs on one machine (separate `tunekit tune` processes, a Ray run beside them) must
not book more than a whole device between them, nor each start their own MPS daemon. The ledger is
one JSON file in a per-user runtime dir, read and written only under an exclusive flock:

  devices: {device: [booking, ...]}  device: "cpu" or "gpu<index>"; a booking: pid + process start
                                      time, pct x servers, the cores it was given (cpu), the MPS
                                      daemon its processes use (gpu), the command line
  mps:     the MPS control daemon the jobs share: its pipe dir, who started it, who uses it now

A process is known by its pid AND its start time, so a pid the kernel handed to another process
does not keep a dead job's booking. Entries of dead processes are dropped whenever the ledger is
read: a SIGKILLed job frees its share for the next one. The daemon is node-wide, not per GPU: one
control daemon serves every GPU it sees, and two on one GPU would fight over it (see
coordinator/fleet_actor.py).
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import sys
import time
import uuid

from ..atomic import write_json_atomic
from ..errors import TunekitError

log = logging.getLogger("tunekit")

RUNTIME_ENV = "TUNEKIT_RUNTIME_DIR"
_POLL_S = 0.5


# ---------------------------------------------------------------- where, and who
def runtime_dir() -> str:
    """$TUNEKIT_RUNTIME_DIR, else $XDG_RUNTIME_DIR/tunekit, else /tmp/tunekit-<uid>; made private.
    Every tunekit process of this user on this machine must agree on it (tests set their own)."""
    root = os.environ.get(RUNTIME_ENV)
    if not root:
        xdg = os.environ.get("XDG_RUNTIME_DIR")
        root = os.path.join(xdg, "tunekit") if xdg and os.path.isdir(xdg) else f"/tmp/tunekit-{os.getuid()}"
    try:
        os.makedirs(root, mode=0o700, exist_ok=True)
        owner = os.stat(root).st_uid
    except OSError as exc:
        raise TunekitError(f"cannot use the runtime dir {root}: {exc.strerror or exc} (set {RUNTIME_ENV})") from None
    if owner != os.getuid():
        # In /tmp another user could have made it first, to read or forge our ledger.
        raise TunekitError(f"the runtime dir {root} belongs to another user: set {RUNTIME_ENV} to a directory of yours")
    return root


def process_start(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), or None when no such process runs (a zombie,
    killed but not yet reaped, does not run)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()  # the command name may hold spaces and ')'
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])


def _me() -> dict:
    return {"pid": os.getpid(), "start": process_start(os.getpid())}


def _alive(entry: dict) -> bool:
    start = process_start(int(entry.get("pid", -1)))
    return start is not None and start == entry.get("start")


def _command_line() -> str:
    args = list(sys.argv)
    if args and args[0].endswith(("__main__.py", "/tunekit")):
        args[0] = "tunekit"
    elif args:
        args[0] = os.path.basename(args[0])
    text = " ".join(args)
    return text if len(text) <= 160 else text[:157] + "..."


def gpu_device(index: int | None = None) -> str:
    """The ledger's name for a GPU: gpu<physical index>. `index`: a physical index (Ray fleets);
    None: the GPU this process's CUDA device 0 is, the first of CUDA_VISIBLE_DEVICES."""
    if index is not None:
        return f"gpu{int(index)}"
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if not first:
        return "gpu0"
    if first.isdigit():
        return f"gpu{int(first)}"
    try:  # a UUID: the same GPU as its index
        import pynvml

        pynvml.nvmlInit()
        try:
            return f"gpu{pynvml.nvmlDeviceGetIndex(pynvml.nvmlDeviceGetHandleByUUID(first))}"
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return "gpu-" + re.sub(r"[^A-Za-z0-9-]", "", first)[:48]


def device_label(device: str) -> str:
    if device == "cpu":
        return "the CPU cores"
    match = re.fullmatch(r"gpu(\d+)", device)
    return f"GPU {match.group(1)}" if match else device


def check_device(device: str) -> str:
    if not isinstance(device, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", device):
        raise TunekitError(f"not a device name: {device!r} (cpu, gpu0, ...)")
    return device


# ---------------------------------------------------------------- the file
def _reclaim(state: dict) -> None:
    """Drop what dead processes left: their bookings, and their use of the MPS daemon (the
    daemon itself stays: a job that comes later reuses it, and the last one out stops it)."""
    for device in list(state["devices"]):
        live = [e for e in state["devices"][device] if _alive(e)]
        for entry in state["devices"][device]:
            if entry not in live:
                log.info("ledger: reclaimed %s%% of %s from pid %s, which is gone", entry.get("total"), device,
                         entry.get("pid"))
        if live:
            state["devices"][device] = live
        else:
            del state["devices"][device]
    if state.get("mps"):
        state["mps"]["users"] = [u for u in state["mps"].get("users", []) if _alive(u)]


@contextlib.contextmanager
def _ledger():
    """The ledger's state, exclusively ours until the block ends; written back then (not on error)."""
    root = runtime_dir()
    fd = os.open(os.path.join(root, "ledger.lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        path = os.path.join(root, "ledger.json")
        try:
            with open(path) as fh:
                state = json.load(fh)
        except FileNotFoundError:
            state = {}
        except (OSError, ValueError) as exc:
            # Written atomically, so only a hand-edited file gets here: start over rather than stop every job.
            log.warning("ledger %s is unreadable (%s): starting a new one", path, exc)
            state = {}
        state.setdefault("version", 1)
        state.setdefault("devices", {})
        _reclaim(state)
        yield state
        write_json_atomic(path, state)
    finally:
        os.close(fd)  # frees the lock


def holders(device: str) -> list[dict]:
    """The live bookings of `device` (dead ones are reclaimed on the way)."""
    with _ledger() as state:
        return [dict(e) for e in state["devices"].get(check_device(device), [])]


def snapshot() -> dict:
    """The whole ledger, dead entries dropped: {"devices": {...}, "mps": {...} or None}."""
    with _ledger() as state:
        return json.loads(json.dumps({"devices": state["devices"], "mps": state.get("mps")}))


# ---------------------------------------------------------------- shares
def _describe(entries: list[dict]) -> str:
    parts = []
    for e in entries:
        servers = f" ({e['servers']} servers x {e['pct']:g}%)" if e.get("servers", 1) > 1 else ""
        parts.append(f"{e['total']:g}%{servers} by pid {e['pid']}: {e.get('what') or '?'}")
    return "; ".join(parts)


def _refusal(device: str, total: float, servers: int, held: float, entries: list[dict], waited_s: float) -> str:
    need = f"{total:g}%" + (f" ({servers} servers x {total / servers:g}%)" if servers > 1 else "")
    waited = f" after waiting {waited_s:.0f} s" if waited_s > 0 else ""
    if not entries:
        return (f"this job needs {need} of {device_label(device)}, more than all of it: use fewer --servers "
                "or pass --oversubscribe")
    return (f"no room on {device_label(device)}{waited}: this job needs {need}, other tunekit jobs hold {held:g}% "
            f"({_describe(entries)}), together {held + total:g}% > 100%; wait for them (--wait-for-share S) "
            "or pass --oversubscribe")


def _place_cores(count: int, taken: list[list[int]]) -> list[int]:
    """`count` cores of this process's, contiguous (wrapping), where other bookings' cores are
    fewest: two CPU jobs that fit together get disjoint cores instead of both starting at core 0."""
    available = sorted(os.sched_getaffinity(0))
    count = max(1, min(count, len(available)))
    load = {c: 0 for c in available}
    for cores in taken:
        for c in cores or []:
            if c in load:
                load[c] += 1
    n = len(available)
    start = min(range(n), key=lambda s: (sum(load[available[(s + i) % n]] for i in range(count)), s))
    return [available[(start + i) % n] for i in range(count)]


class Booking:
    """A share of a device held by this process; a context manager that gives it back on exit."""

    def __init__(self, device: str, entry: dict):
        self.device = device
        self.id = entry["id"]
        self.total = entry["total"]
        self.cores: list[int] | None = entry.get("cores")
        self.released = False

    def note(self, **fields) -> None:
        """Add facts to this booking's entry (the MPS daemon its processes use)."""
        with _ledger() as state:
            for entry in state["devices"].get(self.device, []):
                if entry["id"] == self.id:
                    entry.update(fields)

    def release(self) -> None:
        if self.released:
            return
        with _ledger() as state:
            entries = [e for e in state["devices"].get(self.device, []) if e["id"] != self.id]
            if entries:
                state["devices"][self.device] = entries
            else:
                state["devices"].pop(self.device, None)
        self.released = True

    def __enter__(self) -> "Booking":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def book(device: str, pct_total: float, *, servers: int = 1, oversubscribe: bool = False, wait_s: float = 0.0,
         cores: int | None = None, what: str | None = None) -> Booking:
    """Book `pct_total` percent of `device` (a job with N servers at p% books N x p) for this process.

    Refused in one line (TunekitError) naming who holds what when the device's bookings would pass
    100%; with `wait_s`, first waits up to that long for others to leave; with `oversubscribe`,
    booked anyway (with a warning). `cores`: for the CPU, how many cores to set aside (the booking's
    `cores`, away from other jobs' where there is room)."""
    check_device(device)
    if not isinstance(pct_total, (int, float)) or isinstance(pct_total, bool) or not pct_total > 0:
        raise TunekitError(f"a booking needs a positive percentage, got {pct_total!r}")
    if not isinstance(servers, int) or isinstance(servers, bool) or servers < 1:
        raise TunekitError(f"a booking needs a positive number of servers, got {servers!r}")
    started = time.monotonic()
    told = False
    while True:
        with _ledger() as state:
            entries = state["devices"].get(device, [])
            held = sum(e["total"] for e in entries)
            fits = held + pct_total <= 100
            waited = time.monotonic() - started
            if not fits and not oversubscribe and (waited >= wait_s or not entries):
                # out of time, or nothing to wait for (this job alone is more than the device)
                raise TunekitError(_refusal(device, pct_total, servers, held, entries, waited if wait_s else 0))
            if fits or oversubscribe:
                if not fits:
                    log.warning("--oversubscribe: %s booked %g%% with this job%s", device_label(device),
                                held + pct_total, f" ({_describe(entries)})" if entries else "")
                entry = {"id": uuid.uuid4().hex[:12], **_me(), "pct": pct_total / servers, "servers": servers,
                         "total": pct_total, "what": what or _command_line(), "since": round(time.time(), 3)}
                if cores is not None:
                    entry["cores"] = _place_cores(cores, [e.get("cores") for e in entries])
                state["devices"][device] = [*entries, entry]
                return Booking(device, entry)
        if not told:
            log.warning("waiting up to %.0f s for %s: other tunekit jobs hold %g%% (%s)", wait_s,
                        device_label(device), held, _describe(entries))
            told = True
        time.sleep(min(_POLL_S, max(0.01, wait_s - waited)))


# ---------------------------------------------------------------- the shared MPS daemon
class SharedMPS:
    """This process's use of the MPS daemon tunekit jobs share. `release` (or leaving the `with`)
    stops the daemon only when no live job uses it any more, whoever started it."""

    def __init__(self, pipe_dir: str, log_dir: str | None, *, user_id: str | None, started_by_us: bool):
        self.pipe_dir, self.log_dir = pipe_dir, log_dir
        self.user_id = user_id          # None: a daemon the caller runs (named by the environment)
        self.started_by_us = started_by_us
        self.released = False

    def env(self) -> dict[str, str]:
        env = {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_dir}
        if self.log_dir:
            env["CUDA_MPS_LOG_DIRECTORY"] = self.log_dir
        return env

    def release(self) -> None:
        from .mps import MPSDaemon

        if self.released or self.user_id is None:
            self.released = True
            return
        with _ledger() as state:
            record = state.get("mps")
            if record and record["pipe_dir"] == self.pipe_dir:  # not replaced meanwhile (else not ours to stop)
                record["users"] = [u for u in record["users"] if u["id"] != self.user_id]
                if not record["users"]:  # the last one out; dead users were reclaimed on reading
                    log.info("stopping the shared MPS daemon (%s): no tunekit job uses it any more", self.pipe_dir)
                    MPSDaemon(pipe_dir=record["pipe_dir"], log_dir=record.get("log_dir")).quit()
                    del state["mps"]
        self.released = True

    def __enter__(self) -> "SharedMPS":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def shared_mps() -> SharedMPS:
    """The MPS daemon of this machine's tunekit jobs: the one recorded in the ledger when it still
    answers (even if the job that started it is gone), else a new one in a private pipe dir. A daemon
    the environment names (CUDA_MPS_PIPE_DIRECTORY) and the ledger does not is the caller's: used,
    never recorded or stopped."""
    from .mps import MPSDaemon, require_mps_control

    require_mps_control()
    given = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
    with _ledger() as state:
        record = state.get("mps")
        if given and os.path.exists(os.path.join(given, "control")) and not (record and record["pipe_dir"] == given):
            return SharedMPS(given, os.environ.get("CUDA_MPS_LOG_DIRECTORY"), user_id=None, started_by_us=False)
        started = False
        if not record or not MPSDaemon(pipe_dir=record["pipe_dir"], log_dir=record.get("log_dir")).answers():
            if record:
                log.warning("the shared MPS daemon (%s) no longer answers: starting another", record["pipe_dir"])
            daemon = MPSDaemon(pipe_dir=None).launch()
            record = {"pipe_dir": daemon.pipe_dir, "log_dir": daemon.log_dir, "started_by": {**_me(),
                      "what": _command_line()}, "started_at": round(time.time(), 3), "users": []}
            state["mps"] = record
            started = True
        user = {"id": uuid.uuid4().hex[:12], **_me()}
        record["users"].append(user)
        return SharedMPS(record["pipe_dir"], record.get("log_dir"), user_id=user["id"], started_by_us=started)
