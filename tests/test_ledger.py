"""Several tunekit jobs on one machine: the ledger of shares per device (shares/ledger.py), the MPS
daemon they share, and the per-device measurement lock (shares/measure_lock.py). Real processes, real
`tunekit tune` runs, real runner servers; every test has its own runtime dir (TUNEKIT_RUNTIME_DIR)."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tunekit.errors import TunekitError
from tunekit.shares import ledger
from tunekit.shares.measure_lock import measuring
from tunekit.shares.share import Share
from tunekit.testing import add_one_module, build_inputs, local_fleet, run_cli, session_runner


@pytest.fixture(autouse=True)
def runtime(tmp_path, monkeypatch):
    """A private ledger for this test and every process it starts."""
    root = tmp_path / "runtime"
    monkeypatch.setenv(ledger.RUNTIME_ENV, str(root))
    return root


def _python(code: str, **kwargs) -> subprocess.Popen:
    """A real process running `code` (it sees this test's runtime dir and PATH)."""
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")


def _one_line(message: str, *fragments: str) -> str:
    assert message and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


_HOLD = """
    import sys
    from tunekit.shares import ledger
    booking = ledger.book({device!r}, {pct}, what="holder")
    print("booked", flush=True)
    sys.stdin.readline()  # hold it until told to go (or killed)
    booking.release()
"""


# ---------------------------------------------------------------- the ledger's rules
def test_bookings_add_up_to_100_per_device_and_a_refusal_names_the_holders():
    with ledger.book("fake0", 60, what="first job"):
        with pytest.raises(TunekitError) as refused:
            ledger.book("fake0", 60)
        _one_line(str(refused.value), "fake0", "60%", f"pid {os.getpid()}", "first job", "120% > 100%",
                  "--oversubscribe", "--wait-for-share")
        with ledger.book("fake0", 40), ledger.book("fake1", 100):  # up to 100% fits; other devices are apart
            assert sorted(e["total"] for e in ledger.holders("fake0")) == [40, 60]
        with ledger.book("fake0", 60, oversubscribe=True):
            assert sum(e["total"] for e in ledger.holders("fake0")) == 120
        # a job of 2 servers at 30% books 60%
        with pytest.raises(TunekitError) as servers:
            ledger.book("fake0", 60, servers=2)
        _one_line(str(servers.value), "2 servers x 30%")
    assert ledger.holders("fake0") == []  # leaving the `with` gave the share back
    with pytest.raises(TunekitError) as alone:  # more than the device on its own: nothing to wait for
        ledger.book("fake0", 120, servers=3, wait_s=60)
    _one_line(str(alone.value), "120%", "more than all of it")


def test_a_killed_jobs_booking_is_reclaimed_even_before_it_is_reaped():
    holder = _python(_HOLD.format(device="fake0", pct=100))
    try:
        assert holder.stdout.readline().strip() == "booked"
        with pytest.raises(TunekitError, match=f"pid {holder.pid}"):
            ledger.book("fake0", 10)
        holder.send_signal(signal.SIGKILL)
        _wait_for(lambda: ledger.process_start(holder.pid) is None, 30, "the killed holder to be gone")
        assert os.path.exists(f"/proc/{holder.pid}")  # not reaped yet (a zombie): still dead to the ledger
        with ledger.book("fake0", 100):
            assert [e["pid"] for e in ledger.holders("fake0")] == [os.getpid()]
    finally:
        holder.kill()
        holder.wait()


def test_a_reused_pid_does_not_keep_a_dead_jobs_booking(runtime):
    with ledger.book("fake0", 30):
        pass  # makes the runtime dir and the ledger file
    state = json.loads((runtime / "ledger.json").read_text())
    mine = ledger.process_start(os.getpid())
    # Two entries under our own pid: one with our start time (us), one from "before" (a job that died
    # and whose pid the kernel gave to us).
    state["devices"]["fake0"] = [
        {"id": "same", "pid": os.getpid(), "start": mine, "pct": 30, "servers": 1, "total": 30, "what": "us"},
        {"id": "old", "pid": os.getpid(), "start": mine - 1, "pct": 70, "servers": 1, "total": 70, "what": "dead"}]
    (runtime / "ledger.json").write_text(json.dumps(state))
    assert [e["id"] for e in ledger.holders("fake0")] == ["same"]
    with ledger.book("fake0", 70):  # 30 + 70: the dead job's 70% is free again
        pass


def test_wait_for_share_waits_for_a_job_to_leave_and_gives_up_after_its_time():
    holder = _python(_HOLD.format(device="fake0", pct=80))
    try:
        assert holder.stdout.readline().strip() == "booked"
        started = time.monotonic()
        with pytest.raises(TunekitError) as timed_out:
            ledger.book("fake0", 40, wait_s=1.5)
        assert time.monotonic() - started >= 1.5
        _one_line(str(timed_out.value), "after waiting", "holder", "--oversubscribe")
        # told to leave in 2 s; a job that waits up to 60 s gets the share then
        threading.Timer(2.0, lambda: (holder.stdin.write("\n"), holder.stdin.flush())).start()
        started = time.monotonic()
        with ledger.book("fake0", 40, wait_s=60) as booking:
            waited = time.monotonic() - started
            assert 1.0 < waited < 30, waited
            assert [e["id"] for e in ledger.holders("fake0")] == [booking.id]
    finally:
        holder.kill()
        holder.wait()


def test_cpu_bookings_that_fit_together_get_disjoint_cores():
    available = sorted(os.sched_getaffinity(0))
    half = max(1, len(available) // 2)
    with ledger.book("cpu", 50, cores=half) as first, ledger.book("cpu", 50, cores=half) as second:
        assert len(first.cores) == len(second.cores) == half
        if len(available) >= 2:
            assert not set(first.cores) & set(second.cores), (first.cores, second.cores)


# ---------------------------------------------------------------- one MPS daemon for every job
_FAKE_MPS_CONTROL = """\
#!/bin/sh
# Stand-in for NVIDIA's nvidia-cuda-mps-control: `-d` "starts" a daemon (a control file in the pipe
# dir), a command on stdin talks to it; every start and quit is appended to $FAKE_MPS_LOG.
pipe="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
if [ "$1" = "-d" ]; then
    if [ -e "$pipe/control" ]; then echo "An instance of this daemon is already running" >&2; exit 1; fi
    : > "$pipe/control"
    echo "start $pipe devices=${CUDA_VISIBLE_DEVICES-all}" >> "$FAKE_MPS_LOG"
    exit 0
fi
read -r command
if [ ! -e "$pipe/control" ]; then echo "Cannot find MPS control daemon process" >&2; exit 1; fi
if [ "$command" = "quit" ]; then rm -f "$pipe/control"; echo "quit $pipe" >> "$FAKE_MPS_LOG"; fi
exit 0
"""

_MPS_JOB = """
    import sys
    from tunekit.shares.ledger import shared_mps
    daemon = shared_mps()
    print(daemon.pipe_dir, daemon.started_by_us, flush=True)
    sys.stdin.readline()  # use it until told to go (or killed)
    daemon.release()
    print("left", flush=True)
"""


@pytest.fixture
def fake_mps(tmp_path, monkeypatch):
    """A fake nvidia-cuda-mps-control first on PATH; returns a function that reads its start/quit log."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-cuda-mps-control"
    script.write_text(_FAKE_MPS_CONTROL)
    script.chmod(0o755)
    log = tmp_path / "mps.log"
    log.touch()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_MPS_LOG", str(log))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the daemon must still see every GPU
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # the daemons' private dirs, removed with the test
    return lambda: log.read_text().splitlines()


class _Job:
    def __init__(self):
        self.proc = _python(_MPS_JOB)
        line = self.proc.stdout.readline().split()
        assert len(line) == 2, self.proc.stderr.read()
        self.pipe_dir, self.started = line[0], line[1] == "True"

    def leave(self):
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline().strip() == "left", self.proc.stderr.read()
        assert self.proc.wait(timeout=30) == 0

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)


def test_jobs_share_one_mps_daemon_and_only_the_last_one_out_stops_it(fake_mps):
    first = _Job()
    assert first.started and fake_mps() == [f"start {first.pipe_dir} devices=all"]
    second = _Job()
    assert (second.pipe_dir, second.started) == (first.pipe_dir, False)  # reused, not a second daemon
    assert ledger.snapshot()["mps"]["started_by"]["pid"] == first.proc.pid
    first.leave()  # the job that started it leaves: the second still uses it
    assert fake_mps() == [f"start {first.pipe_dir} devices=all"]
    third = _Job()  # its starter is gone, the daemon is still in use: reused
    assert (third.pipe_dir, third.started) == (first.pipe_dir, False)
    second.kill()  # a user that dies without leaving does not keep it, nor stop it
    assert len(fake_mps()) == 1
    third.leave()  # the last one out stops it
    assert fake_mps() == [f"start {first.pipe_dir} devices=all", f"quit {first.pipe_dir}"]
    assert ledger.snapshot()["mps"] is None

    # A daemon whose every user was killed is reused by the next job, which stops it when it leaves.
    orphaning = _Job()
    assert orphaning.started and orphaning.pipe_dir != first.pipe_dir
    orphaning.kill()
    heir = _Job()
    assert (heir.pipe_dir, heir.started) == (orphaning.pipe_dir, False)
    heir.leave()
    assert fake_mps()[-2:] == [f"start {orphaning.pipe_dir} devices=all", f"quit {orphaning.pipe_dir}"]

    # A recorded daemon that no longer answers (killed outside tunekit) is replaced, not reused.
    gone = _Job()
    os.remove(os.path.join(gone.pipe_dir, "control"))
    fresh = _Job()
    assert fresh.started and fresh.pipe_dir != gone.pipe_dir
    gone.leave()  # the replaced daemon's user leaves: the new one stays
    assert fake_mps()[-1] == f"start {fresh.pipe_dir} devices=all"
    fresh.leave()
    assert fake_mps()[-1] == f"quit {fresh.pipe_dir}"


def test_a_gpu_share_session_books_its_gpu_and_shares_the_daemon(fake_mps):
    """The session every command opens at a GPU share, on this GPU-less machine: the SM check cannot
    pass, so it runs unenforced (allowed here), but it books the GPU and goes through the daemon."""
    from tunekit.run.session import ShareSession

    other = _Job()  # another job's daemon is running
    with ShareSession(Share("gpu", 40), allow_unenforced=True, servers=2) as session:
        (entry,) = ledger.holders("gpu1")  # CUDA_VISIBLE_DEVICES=1: physical GPU 1
        assert (entry["total"], entry["servers"], entry["mps_pipe_dir"]) == (80, 2, other.pipe_dir)
        assert session.mps.pipe_dir == other.pipe_dir and not session.mps.started_by_us
        with pytest.raises(TunekitError, match="no room on GPU 1"):
            ShareSession(Share("gpu", 40), allow_unenforced=True).__enter__()
    assert ledger.holders("gpu1") == [] and len(fake_mps()) == 1  # the other job still uses the daemon
    other.leave()
    assert fake_mps()[-1] == f"quit {other.pipe_dir}"


# ---------------------------------------------------------------- the measurement lock
def test_measure_lock_is_held_across_processes():
    holder = _python("""
        import sys, time
        from tunekit.shares.measure_lock import measuring
        with measuring("fake0"):
            print("holding", flush=True)
            time.sleep(1.5)
    """)
    try:
        assert holder.stdout.readline().strip() == "holding"
        with measuring("fake0") as waited:
            assert waited > 0.5, waited
        with measuring("fake0") as waited:  # free: no wait
            assert waited < 0.5
    finally:
        holder.kill()
        holder.wait()


def _overlaps(a: list, b: list) -> int:
    return sum(1 for s1, e1 in a for s2, e2 in b if s1 < e2 and s2 < e1)


def _measure_in_two_runners(tmp_path, pool, fleet, measure_lock):
    """Two SessionRunners, each with its own session on one fleet of 2 servers, given 3 candidates each at the same
    moment. Returns each runner's measurement intervals and the runners."""
    runners = [session_runner(fleet, sessions=1, min_repeat_ms=250, measure_lock=measure_lock) for _ in range(2)]
    try:
        inputs = [build_inputs(pool, [add_one_module()] * 3) for _ in runners]
        futures = [runner.run(batch) for runner, batch in zip(runners, inputs)]
        results = [[f.result() for f in batch] for batch in futures]
        assert all(r.error_msg is None for batch in results for r in batch), results
        timings = [[runner.timings[str(i.artifact_path)] for i in batch] for runner, batch in zip(runners, inputs)]
        intervals = [[(t.started_at, t.finished_at) for t in batch] for batch in timings]
        return intervals, runners
    finally:
        for runner in runners:
            runner.shutdown()


@pytest.fixture(scope="module")
def two_server_fleet(tmp_path_factory):
    from tunekit.clients.build_pool import BuildPool

    pool = BuildPool(workers=1, timeout_s=120, artifact_dir=str(tmp_path_factory.mktemp("artifacts")))
    try:
        with local_fleet("t-measure-lock", share=Share("cpu", 100), servers=2) as fleet:
            yield pool, fleet
    finally:
        pool.shutdown()


@pytest.mark.e2e
def test_measure_lock_on_two_runners_never_measure_at_once(tmp_path, runtime, two_server_fleet):
    intervals, runners = _measure_in_two_runners(tmp_path, *two_server_fleet, measure_lock=True)
    assert _overlaps(*intervals) == 0, intervals
    stats = [r.measure_lock_stats() for r in runners]
    assert [s["locked_measurements"] for s in stats] == [3, 3]
    assert sum(s["lock_wait_s"] for s in stats) > 0.2, stats  # one waited for the other
    assert (runtime / "measure-cpu.lock").exists()


@pytest.mark.parametrize("setting", [False, "auto"])  # auto: GPU only, so off for CPU candidates
@pytest.mark.e2e
def test_measure_lock_off_two_runners_measure_at_once(tmp_path, runtime, two_server_fleet, setting):
    intervals, runners = _measure_in_two_runners(tmp_path, *two_server_fleet, measure_lock=setting)
    assert _overlaps(*intervals) > 0, intervals
    assert [r.measure_lock_stats()["locked_measurements"] for r in runners] == [0, 0]
    assert not (runtime / "measure-cpu.lock").exists()


# ---------------------------------------------------------------- real `tunekit tune` processes
def _tune(model, out, *args, log) -> subprocess.Popen:
    """`tunekit tune MODEL --out OUT ARGS...` in the background; its stderr (logs) goes to `log`."""
    with open(log, "w") as sink:
        return subprocess.Popen([sys.executable, "-m", "tunekit.cli", "tune", str(model), "--out", str(out),
                                 *map(str, args)], stdout=subprocess.PIPE, stderr=sink, text=True)


def _booked_by(pid: int):
    return [e for e in ledger.holders("cpu") if e["pid"] == pid]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # a clean stop: every process it started goes with it
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout:
        proc.stdout.close()


def _error_line(proc) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.startswith("tunekit: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]
    return lines[0]


@pytest.mark.e2e
def test_a_second_tune_past_100_percent_is_refused_and_runs_with_oversubscribe(example_model, tmp_path):
    # 60% + 60% of the cores > 100%
    first = _tune(example_model, tmp_path / "first", "--cpu-pct", "60", "--trials", "400", "--trials-per-iter", "2",
                  log=tmp_path / "first.log")
    try:
        _wait_for(lambda: _booked_by(first.pid) or first.poll() is not None, 300, "the first job's booking")
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
        refused = run_cli("tune", example_model, "--cpu-pct", "60", "--trials", "2", "--out", tmp_path / "second")
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert "Traceback" not in refused.stderr
        _one_line(_error_line(refused), "the CPU cores", f"pid {first.pid}", "60%", "120% > 100%", "--oversubscribe")
        allowed = run_cli("tune", example_model, "--cpu-pct", "60", "--trials", "2", "--trials-per-iter", "2",
                          "--out", tmp_path / "third", "--oversubscribe", "--json")
        assert allowed.returncode == 0, allowed.stderr[-2000:]
        assert json.loads(allowed.stdout)["report"]["trials"]["measured"] == 2
        assert first.poll() is None  # the first job ran all along
        assert [e["pid"] for e in ledger.holders("cpu")] == [first.pid]  # the finished one gave its share back
    finally:
        _stop(first)
    assert ledger.holders("cpu") == []  # stopped with SIGTERM: its booking went with it


@pytest.mark.e2e
def test_a_waiting_tune_starts_once_the_killed_job_is_reclaimed(example_model, tmp_path):
    first = _tune(example_model, tmp_path / "first", "--cpu-pct", "60", "--trials", "400", "--trials-per-iter", "2",
                  log=tmp_path / "first.log")
    waiting = None
    try:
        _wait_for(lambda: _booked_by(first.pid) or first.poll() is not None, 300, "the first job's booking")
        assert first.poll() is None, (tmp_path / "first.log").read_text()[-2000:]
        log = tmp_path / "waiting.log"
        waiting = _tune(example_model, tmp_path / "second", "--cpu-pct", "60", "--trials", "2", "--trials-per-iter",
                        "2", "--wait-for-share", "240", "--json", log=log)
        # it gets as far as the booking, and waits there
        _wait_for(lambda: "waiting up to 240 s" in log.read_text() or waiting.poll() is not None, 300,
                  "the second job to wait for its share")
        assert waiting.poll() is None, log.read_text()[-2000:]
        assert _booked_by(waiting.pid) == [] and len(_booked_by(first.pid)) == 1
        first.send_signal(signal.SIGKILL)  # no goodbye: its entry must be reclaimed
        first.wait(timeout=30)
        out, _ = waiting.communicate(timeout=600)
        assert waiting.returncode == 0, log.read_text()[-3000:]
        assert json.loads(out)["report"]["trials"]["measured"] == 2
        assert ledger.holders("cpu") == []
    finally:
        _stop(first)
        if waiting is not None:
            _stop(waiting)
