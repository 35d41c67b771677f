"""Real tracker and runner servers on 127.0.0.1, pinned to a CPU share."""
import time

import numpy as np
import psutil
import tvm
from tvm import rpc, te

from tunekit.servers.fleet import FleetConfig, RunnerFleet
from tunekit.shares.pinning import pinned_env
from tunekit.shares.share import Share


def _session_add_one(fleet, lib_path):
    remote = rpc.connect_tracker("127.0.0.1", fleet.tracker_port).request(fleet.key, session_timeout=30)
    remote.upload(lib_path)
    func = remote.load_module("add.so")
    a = tvm.runtime.tensor(np.ones(64, "float32"), remote.cpu())
    b = tvm.runtime.tensor(np.zeros(64, "float32"), remote.cpu())
    func(a, b)
    return b.numpy()


def _add_lib(tmp_path):
    A = te.placeholder((64,), name="A")
    B = te.compute((64,), lambda i: A[i] + 1, name="B")
    path = str(tmp_path / "add.so")
    tvm.compile(te.create_prim_func([A, B]), target="llvm").export_library(path)
    return path


def test_warm_server_is_pinned_reused_restarted_and_stopped(tmp_path):
    lib = _add_lib(tmp_path)
    share = Share("cpu", 50)
    fleet = RunnerFleet(key="t-warm", pinned=pinned_env(share), config=FleetConfig(servers=1))
    with fleet:
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
        while fleet.free_servers() < 1 and time.time() < deadline:
            time.sleep(0.2)
        assert np.allclose(_session_add_one(fleet, lib), 2.0)
        started = [*fleet.server_pids]
    time.sleep(0.5)
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in started)


def test_ports_are_not_the_well_known_ones():
    with RunnerFleet(key="t-ports", pinned=pinned_env(Share("cpu", 50)), config=FleetConfig(servers=1)) as fleet:
        assert fleet.tracker_port not in (9190, 9090)
        conns = [c for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN
                 and c.laddr.port == fleet.tracker_port]
        assert conns and all(c.laddr.ip == "127.0.0.1" for c in conns)
