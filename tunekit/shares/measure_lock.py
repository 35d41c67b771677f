"""One measurement at a time per device, across threads, tuning clients, Ray actors and separate
tunekit processes of this machine.

Two runner servers timing candidates at once on one GPU share its memory bandwidth and L2 (MPS
caps the SMs of each, it does not isolate them), so each disturbs the other's timings. A
candidate's measurement (upload to result) therefore holds the device's lock: an flock on a file in
the runtime dir (shares.ledger.runtime_dir), so every process of this user on this machine sees the
same lock, and each holder opens the file itself, so threads of one process exclude each other too
(flock belongs to the open file, not the process).

A turnstile keeps it fair: a waiter holds the gate while it waits for the lock, so a runner that just
measured queues behind it instead of taking the lock straight back (flock wakes waiters in no order).
A holder that dies releases the lock with its file.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import time

from .ledger import check_device, runtime_dir


@contextlib.contextmanager
def measuring(device: str):
    """Hold `device`'s measurement lock for the block; yields the seconds spent waiting for it."""
    root = runtime_dir()
    base = os.path.join(root, f"measure-{check_device(device)}")
    gate = os.open(base + ".gate", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        lock = os.open(base + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            started = time.monotonic()
            fcntl.flock(gate, fcntl.LOCK_EX)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
            finally:
                fcntl.flock(gate, fcntl.LOCK_UN)
            yield time.monotonic() - started
        finally:
            os.close(lock)
    finally:
        os.close(gate)
