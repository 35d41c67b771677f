"""Real tracker and runner servers on 127.0.0.1, pinned to a CPU share."""
import contextlib
import errno
import socket
import time

import numpy as np
import psutil
import pytest
import tvm
from tvm import rpc

from tunekit.shares.share import Share
from tunekit.testing import add_one_module, local_fleet


def _session_add_one(fleet, lib_path):
    remote = rpc.connect_tracker("127.0.0.1", fleet.tracker_port).request(fleet.key, session_timeout=30)
    remote.upload(lib_path)
    func = remote.load_module("add.so")
    a = tvm.runtime.tensor(np.ones(64, "float32"), remote.cpu())
    b = tvm.runtime.tensor(np.zeros(64, "float32"), remote.cpu())
    func(a, b)
    return b.numpy()


def _add_lib(tmp_path):
    path = str(tmp_path / "add.so")
    tvm.compile(add_one_module(64), target="llvm").export_library(path)
    return path


def _listening(port: int) -> set:
    """The addresses something listens on at `port` (TCP)."""
    return {c.laddr.ip for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN
            and c.laddr.port == port}


@pytest.mark.e2e
def test_warm_server_is_pinned_reused_restarted_and_stopped(tmp_path):
    lib = _add_lib(tmp_path)
    share = Share("cpu", 50)
    with local_fleet("t-warm", share=share) as fleet:
        (pid,) = fleet.server_pids
        assert psutil.Process(pid).cpu_affinity() == share.cpu_cores()
        assert psutil.Process(pid).environ()["TVM_NUM_THREADS"] == str(len(share.cpu_cores()))
        for _ in range(2):  # the same warm process serves consecutive sessions
            assert np.allclose(_session_add_one(fleet, lib), 2.0)
        assert fleet.server_pids == [pid] and fleet.restarts == 0
        psutil.Process(pid).kill()  # a crashed server is replaced, the fleet goes on
        deadline = time.time() + 30
        while fleet.restarts == 0 and time.time() < deadline:
            time.sleep(0.2)
        assert fleet.restarts == 1
        deadline = time.time() + 30
        while fleet.registered_servers() < 1 and time.time() < deadline:
            time.sleep(0.2)
        assert np.allclose(_session_add_one(fleet, lib), 2.0)
        started = [*fleet.server_pids]
    time.sleep(0.5)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in started)


def _server_ports(fleet) -> set:
    (pid,) = fleet.server_pids
    return {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN}


@pytest.mark.e2e
def test_two_fleets_at_once_get_their_own_ports_on_loopback_only():
    with local_fleet("t-ports-a") as a, local_fleet("t-ports-b") as b:
        ports = {}
        for fleet in (a, b):
            servers = _server_ports(fleet)
            assert servers, f"{fleet.key}: its server listens on nothing"
            ports[fleet.key] = {fleet.tracker_port} | servers
            for port in ports[fleet.key]:
                assert _listening(port) == {"127.0.0.1"}, (fleet.key, port)
        assert a.tracker_port != b.tracker_port
        assert not ports["t-ports-a"] & ports["t-ports-b"], ports  # no port shared between the two fleets


def _listening_ports() -> set:
    return {c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN}


def _port_is_taken(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            assert exc.errno == errno.EADDRINUSE, exc
            return True
    return False


@pytest.mark.e2e
def test_a_fleet_starts_and_serves_while_9190_is_taken(tmp_path):
    lib = _add_lib(tmp_path)
    with contextlib.ExitStack() as stack:
        # Bound, not listening: nobody can bind 9190 now, and a fleet that dialled 9190 for its
        # tracker would be refused (a clean failure, not a hang on our socket).
        holder = stack.enter_context(socket.socket())
        try:
            holder.bind(("127.0.0.1", 9190))
        except OSError as exc:  # somebody else holds it already: that is the case under test too
            assert exc.errno == errno.EADDRINUSE, exc
        assert _port_is_taken(9190)
        fleet = stack.enter_context(local_fleet("t-9190", start_timeout_s=20))
        assert fleet.tracker_port != 9190
        assert np.allclose(_session_add_one(fleet, lib), 2.0)


def test_the_trackers_port_is_held_by_the_fleets_process_through_a_tracker_restart(tmp_path):
    """The fleet's process binds the tracker's socket and the tracker process serves it: no other process can take the
    port between its choice and the tracker's bind (a tune started beside other jobs died of that, "the RPC tracker
    exited at start-up"), nor while a killed tracker is replaced; the replacement serves sessions on it."""
    lib = _add_lib(tmp_path)
    with local_fleet("t-held") as fleet:
        ours = {c.laddr.port for c in psutil.Process().net_connections("tcp") if c.status == psutil.CONN_LISTEN}
        assert fleet.tracker_port in ours
        psutil.Process(fleet._tracker.pid).kill()
        assert _port_is_taken(fleet.tracker_port)
        deadline = time.time() + 30
        while fleet.tracker_restarts < 1 and time.time() < deadline:
            time.sleep(0.1)
        assert fleet.tracker_restarts == 1
        assert np.allclose(_session_add_one(fleet, lib), 2.0)


def test_a_warm_server_serves_a_socket_its_parent_bound(tmp_path):
    """`warm_server --listen-fd`: the fleet binds each warm server's socket (the port is never free before the server
    listens) and the server registers it with the tracker and serves sessions on it."""
    import subprocess
    import sys

    lib = _add_lib(tmp_path)
    with local_fleet("t-fd") as fleet, socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        port = sock.getsockname()[1]
        server = subprocess.Popen([sys.executable, "-m", "tunekit.servers.warm_server", "--tracker",
                                   f"127.0.0.1:{fleet.tracker_port}", "--key", "t-fd-own", "--host", "127.0.0.1",
                                   "--port", str(port), "--listen-fd", str(sock.fileno())], pass_fds=(sock.fileno(),))
        try:
            remote = rpc.connect_tracker("127.0.0.1", fleet.tracker_port).request("t-fd-own", session_timeout=30)
            assert remote.get_function("tunekit.compare_outputs") is not None  # a warm server: ours, not TVM's
            remote.upload(lib)
            a = tvm.runtime.tensor(np.ones(64, "float32"), remote.cpu())
            b = tvm.runtime.tensor(np.zeros(64, "float32"), remote.cpu())
            remote.load_module("add.so")(a, b)
            assert np.allclose(b.numpy(), 2.0)
            listening = {c.laddr.port for c in psutil.Process(server.pid).net_connections("tcp")
                         if c.status == psutil.CONN_LISTEN}
            assert listening == {port}
        finally:
            server.kill()
            server.wait()


def test_free_port_never_hands_out_a_port_twice():
    """Fleets of several shares start at once and pick ports while each other's trackers and servers are
    still starting; the kernel hands a just-released port out again often enough (a few thousand picks
    from its ~28,000 ephemeral ports collide with near certainty) that two children could race for one."""
    from tunekit.servers.ports import free_port

    picked = [free_port() for _ in range(3000)]
    assert len(set(picked)) == len(picked)
