"""Faults during tuning, with real processes killed for real (no mocks): runner servers, the whole
`tunekit tune` process, every server of a share; and the RPC secret that guards the warm servers."""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import psutil
import pytest
from tvm import rpc

from tunekit.clients.build_pool import BuildPool
from tunekit.clients.session_runner import ServersGone, is_not_measured
from tunekit.errors import RunFailed, TunekitError
from tunekit.servers.fleet import FleetConfig, RunnerFleet, listen_secret, load_rpc_secret
from tunekit.shares.pinning import pinned_env
from tunekit.shares.share import Share
from tunekit.testing import (add_one_module, alive_after, build_inputs, children_running, crash_module, distinct,
                             local_fleet, record_keys, record_lines, run_cli, session_runner, slow_module,
                             tune_process, wait_for_records)

pytestmark = pytest.mark.e2e

SECRET = b"tunekit-test-secret-0123456789abcdef"
WARM_SERVER = "tunekit.servers.warm_server"


# ---- runner servers that die ----
def test_a_candidate_that_crashes_its_server_is_retried_once_then_recorded_failed(tmp_path):
    pool = BuildPool(workers=1, timeout_s=60, artifact_dir=str(tmp_path))
    crash, ok = build_inputs(pool, [crash_module(), add_one_module()])
    with local_fleet("t-crash") as fleet:
        runner = session_runner(fleet, candidate_timeout_s=60)
        try:
            crashed, after = [f.result() for f in runner.run([crash, ok])]
            assert crashed.error_msg is not None and "died twice" in crashed.error_msg
            assert not is_not_measured(crashed)  # a real trial: recorded as failed by the tuning loop
            assert after.error_msg is None and min(after.run_secs) > 0  # the run goes on, on a new server
            assert runner.retried == 1 and runner.failed_after_retry == 1 and runner.retry_survived == 0
            deadline = time.time() + 30
            while fleet.deaths < 2 and time.time() < deadline:
                time.sleep(0.2)
            assert fleet.deaths == 2 and fleet.restarts == 2  # each attempt killed one server
        finally:
            runner.shutdown()
            pool.shutdown()


def test_killing_a_runner_server_mid_run_loses_no_trial(example_model, tmp_path):
    out = tmp_path / "kill-server"
    db = out / "records-cpu50"
    proc = tune_process(example_model, out, "--trials", "16", "--trials-per-iter", "4", "--json")
    assert wait_for_records(proc, db, 4)
    (server,) = children_running(proc.pid, WARM_SERVER)
    server.send_signal(signal.SIGKILL)
    before = record_lines(db)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 0, stderr[-2000:]
    report = json.loads(stdout)["report"]
    after = record_lines(db)
    assert after[:len(before)] == before  # every trial measured before the kill is still there
    assert len(after) == report["trials"]["measured"] == 16
    assert len(distinct(record_keys(db))) == len(after)  # nothing measured twice
    faults = report["faults"]
    assert faults["server_deaths"] == 1 and faults["server_restarts"] == 1 == report["server_restarts"]
    # the candidate that met the dead server was measured again, on the restarted one
    assert faults["retried_candidates"] >= 1 and faults["sessions_lost_to_server_deaths"] >= 1
    assert faults["retried_candidates"] == faults["retried_and_measured"] + faults["failed_after_retry"]
    assert faults["failed_after_retry"] == 0 and faults["hung_candidates"] == 0
    assert os.path.getsize(report["artifact"]) > 0  # the final compile worked


def test_all_servers_gone_stops_the_run_with_a_clear_error_and_keeps_records(example_model, tmp_path):
    out = tmp_path / "gone"
    db = out / "records-cpu50"
    config = tmp_path / "gone.yaml"
    config.write_text("servers_gone_timeout_s: 8\n")
    proc = tune_process(example_model, out, "--trials", "200", "--trials-per-iter", "4", "--config", str(config))
    assert wait_for_records(proc, db, 2)
    before = record_lines(db)
    started = time.time()
    killed = 0
    descendants = psutil.Process(proc.pid).children(recursive=True)
    while proc.poll() is None and time.time() - started < 300:
        # Every replacement the supervisor starts dies at once: restarts keep failing.
        for server in children_running(proc.pid, WARM_SERVER):
            try:
                server.kill()
                killed += 1
            except psutil.Error:
                pass
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 1, (proc.returncode, stderr[-2000:])  # a runtime failure (RunFailed), not bad usage
    assert time.time() - started < 120
    errors = [line for line in stderr.splitlines() if line.startswith("tunekit:")]
    assert len(errors) == 1 and "Traceback" not in stderr, stderr[-2000:]
    assert "share cpu50" in errors[0] and "servers_gone_timeout_s = 8 s" in errors[0], errors[0]
    assert "--resume" in errors[0] and killed >= 2
    after = record_lines(db)
    assert after[:len(before)] == before and len(distinct(record_keys(db))) == len(after)
    summary = run_cli("records", out, "--json")
    assert summary.returncode == 0 and json.loads(summary.stdout)["cpu50"]["trials"] == len(after)
    assert not alive_after(descendants), "tracker, servers and build workers stop with the run"


def test_sigkill_of_the_tune_process_then_resume_keeps_every_trial(example_model, tmp_path):
    out = tmp_path / "sigkill"
    db = out / "records-cpu50"
    proc = tune_process(example_model, out, "--trials", "40", "--trials-per-iter", "4")
    assert wait_for_records(proc, db, 6)
    descendants = psutil.Process(proc.pid).children(recursive=True)
    assert children_running(proc.pid, WARM_SERVER)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()
    before = record_lines(db)  # complete lines only: a line the kill cut off was not a finished trial
    assert len(before) >= 6
    # no tracker, server or build worker outlives the killed run (they watch their parent)
    assert not alive_after(descendants), [p.cmdline() for p in alive_after(descendants, 0)]
    locked = run_cli("tune", example_model, "--cpu-pct", "50", "--trials", "8", "--out", out)
    assert locked.returncode == 2 and "--resume" in locked.stderr  # not appended to by accident
    resumed = run_cli("tune", example_model, "--cpu-pct", "50", "--trials", "8", "--trials-per-iter", "4",
                      "--out", out, "--resume", "--json")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    report = json.loads(resumed.stdout)["report"]
    after = record_lines(db)
    assert after[:len(before)] == before  # every trial measured before the kill is kept
    assert len(after) == len(before) + report["trials"]["measured"] and report["trials"]["measured"] == 8
    assert len(distinct(record_keys(db))) == len(after)  # the resumed run measured no candidate twice
    compiled = run_cli("compile", example_model, "--records", out, "--out", tmp_path / "final.so")
    assert compiled.returncode == 0, compiled.stderr[-1000:]
    assert os.path.getsize(tmp_path / "final.so") > 0


# ---- security ----
def test_a_wrong_secret_is_refused_before_any_code_is_loaded_and_the_server_stays_up(tmp_path):
    pool = BuildPool(workers=1, timeout_s=60, artifact_dir=str(tmp_path))
    (ok,) = build_inputs(pool, [add_one_module()])
    with local_fleet("t-secret", secret=SECRET) as fleet:
        (pid,) = fleet.server_pids
        # A stock TVM client (no proof): refused in the connection handshake, i.e. before an RPC
        # session exists, so nothing can be uploaded or loaded.
        with pytest.raises(Exception, match="cannot find server that matches key"):
            rpc.connect_tracker("127.0.0.1", fleet.tracker_port).request(fleet.key, session_timeout=10, max_retry=1)
        # tunekit's runner with a wrong secret: refused every time; with no session held for the
        # timeout, the runner gives up with a clear error instead of recording failures.
        wrong = session_runner(fleet, servers_gone_timeout_s=6, secret=b"not-the-secret-0123456789")
        try:
            (result,) = [f.result() for f in wrong.run([ok])]
            assert is_not_measured(result) and isinstance(wrong.fatal, ServersGone)
            assert isinstance(wrong.fatal, RunFailed)  # a runtime failure: the CLI exits 1 with it
            assert "refused the session" in str(wrong.fatal) and "not-the-secret" not in str(wrong.fatal)
        finally:
            wrong.shutdown()
        assert fleet.server_pids == [pid] and psutil.pid_exists(pid) and fleet.deaths == 0
        # the same server serves the right client
        right = session_runner(fleet, secret=SECRET)
        try:
            (result,) = [f.result() for f in right.run([ok])]
            assert result.error_msg is None and min(result.run_secs) > 0
        finally:
            right.shutdown()
        log_text = open(fleet.log_path, "rb").read()
        assert b"refused a session" in log_text and SECRET not in log_text
        assert SECRET.decode() not in " ".join(psutil.Process(pid).cmdline())
    pool.shutdown()


def test_listening_beyond_loopback_needs_a_secret(tmp_path, example_model):
    share = pinned_env(Share("cpu", 50))
    with pytest.raises(TunekitError, match="secret"):
        RunnerFleet(key="t-open", pinned=share, config=FleetConfig(host="0.0.0.0")).start()
    with pytest.raises(TunekitError, match="stock servers"):
        RunnerFleet(key="t-open", pinned=share, config=FleetConfig(host="0.0.0.0", server_mode="stock",
                                                                   secret=SECRET)).start()
    secret_file = tmp_path / "secret"
    secret_file.write_bytes(SECRET + b"\n")
    secret_file.chmod(0o600)
    assert listen_secret(listen_host="0.0.0.0", secret_file=str(secret_file), server_mode="warm") == SECRET
    with pytest.raises(TunekitError, match="--engine stock"):  # TVM's RPCRunner cannot send the proof
        listen_secret(listen_host="0.0.0.0", secret_file=str(secret_file), server_mode="warm", engine="stock")
    # the warm server itself refuses too, whoever starts it
    port = socket.socket()
    port.bind(("127.0.0.1", 0))
    env = {k: v for k, v in os.environ.items() if k != "TUNEKIT_RPC_SECRET"}
    lone = subprocess.run([sys.executable, "-m", "tunekit.servers.warm_server", "--tracker", "127.0.0.1:1",
                           "--key", "k", "--host", "0.0.0.0", "--port", str(port.getsockname()[1])],
                          capture_output=True, text=True, timeout=60, env=env)
    port.close()
    assert lone.returncode != 0 and "without a secret" in lone.stderr
    # secret files: unreadable by others, long enough
    loose = tmp_path / "loose"
    loose.write_text("x" * 40 + "\n")
    loose.chmod(0o644)
    with pytest.raises(TunekitError, match="chmod 600"):
        load_rpc_secret(str(loose))
    short = tmp_path / "short"
    short.write_text("abc\n")
    short.chmod(0o600)
    with pytest.raises(TunekitError, match="too short"):
        load_rpc_secret(str(short))
    # with a secret, 0.0.0.0 works: servers listen on every interface and demand the secret
    with local_fleet("t-open", host="0.0.0.0", secret=SECRET) as fleet:
        listening = {c.laddr.ip for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN
                     and c.laddr.port == fleet.tracker_port}
        assert listening == {"0.0.0.0"}
        pool = BuildPool(workers=1, timeout_s=60, artifact_dir=str(tmp_path))
        runner = session_runner(fleet, secret=SECRET)
        try:
            (result,) = [f.result() for f in runner.run(build_inputs(pool, [add_one_module()]))]
            assert result.error_msg is None
        finally:
            runner.shutdown()
            pool.shutdown()
    # the CLI: one line, non-zero, before any work (no out dir written)
    out = tmp_path / "cli-open"
    refused = run_cli("tune", example_model, "--cpu-pct", "50", "--listen-host", "0.0.0.0", "--out", out)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert "--rpc-secret-file" in refused.stderr and not out.exists()


def test_a_killed_tracker_is_restarted_on_its_port_and_the_run_goes_on(tmp_path):
    pool = BuildPool(workers=1, timeout_s=60, artifact_dir=str(tmp_path))
    with local_fleet("t-tracker") as fleet:
        runner = session_runner(fleet, servers_gone_timeout_s=60)
        try:
            assert [f.result().error_msg for f in runner.run(build_inputs(pool, [add_one_module()]))] == [None]
            psutil.Process(fleet._tracker.pid).kill()
            assert [f.result().error_msg for f in runner.run(build_inputs(pool, [add_one_module()]))] == [None]
            # the server dies too: the runner finds its replacement through the restarted tracker
            psutil.Process(fleet.server_pids[0]).kill()
            assert [f.result().error_msg for f in runner.run(build_inputs(pool, [add_one_module()] * 2))] == [None] * 2
            assert fleet.tracker_restarts == 1 and runner.retried == 1 and runner.retry_survived == 1
        finally:
            runner.shutdown()
            pool.shutdown()


def test_clients_sharing_a_fleet_release_idle_sessions_and_wait_rather_than_give_up(tmp_path):
    """Two runners (as two tuning clients) on one server: with release_idle_sessions each holds it only
    while measuring; the one that waits while the other measures does not take the busy server for gone."""
    pool = BuildPool(workers=1, timeout_s=60, artifact_dir=str(tmp_path))
    with local_fleet("t-shared") as fleet:
        config = dict(servers_gone_timeout_s=3, release_idle_sessions=True)
        first, second = session_runner(fleet, **config), session_runner(fleet, **config)
        try:
            slow, ok = build_inputs(pool, [slow_module(), add_one_module()])
            batch_a = first.run([slow, ok])
            time.sleep(1.0)
            started = time.time()
            batch_b = second.run(build_inputs(pool, [add_one_module()] * 2))
            results = [f.result() for f in batch_a + batch_b]
            assert all(r.error_msg is None for r in results), [r.error_msg for r in results]
            assert time.time() - started > 3  # the second one waited longer than its gone-timeout
            assert first.fatal is None and second.fatal is None
            deadline = time.time() + 20
            while fleet.idle_servers() < 1 and time.time() < deadline:
                time.sleep(0.2)
            assert fleet.idle_servers() == 1  # given back to the tracker once the queue ran dry
        finally:
            first.shutdown()
            second.shutdown()
            pool.shutdown()
