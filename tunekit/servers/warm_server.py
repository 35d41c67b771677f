"""A TVM RPC runner server that serves sessions in one warm process.

Stock `tvm.exec.rpc_server` starts a new process for every session: in fork mode that breaks
CUDA (the child inherits an initialised driver), in --no-fork mode each measurement pays ~8 s of
Python start-up and TVM import. This server speaks the same tracker/RPC protocol but runs each
session in-process, so the CUDA context (under its MPS share) stays warm. A candidate that kills
the process is reported to the client as a failed trial; the fleet supervisor restarts the server.

Run: python -m tunekit.servers.warm_server --tracker HOST:PORT --key KEY --host 127.0.0.1 --port P
"""
from __future__ import annotations

import argparse
import os
import socket


def _device_healthy() -> bool:
    import tvm

    try:
        device = tvm.cuda(0)
        tvm.runtime.empty((1,), "float32", device)
        device.sync()
        return True
    except Exception:
        return False


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--tracker", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--check-cuda", action="store_true", help="exit when a session leaves the CUDA context broken")
    args = parser.parse_args(argv)

    from tvm.support import utils
    from tvm.rpc import server as rpc_server

    def serve_in_process(sock, addr, opts, load_library):
        work_path = utils.tempdir()
        old_cwd = os.getcwd()
        os.chdir(work_path.path)  # keep sessions' files apart
        try:
            rpc_server._serve_loop(sock, load_library, work_path)
        finally:
            os.chdir(old_cwd)
            work_path.remove()
            sock.detach()  # ServerLoop owns and has closed the fd; closing it again could hit a reused fd
            if args.check_cuda and not _device_healthy():
                # A candidate corrupted the CUDA context (illegal address, ...): every later session
                # would fail too. Exit before re-registering; the fleet supervisor starts a fresh server.
                os._exit(3)

    # The listen loop (tracker registration, key matching) is TVM's own; only the session
    # handling changes, which keeps us compatible with RPCRunner and the tracker.
    rpc_server._serving = serve_in_process
    tracker_host, tracker_port = args.tracker.rsplit(":", 1)
    listen = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listen.bind((args.host, args.port))
    listen.listen(1)
    rpc_server._listen_loop(listen, args.port, args.key, (tracker_host, int(tracker_port)), None, args.host)


if __name__ == "__main__":
    main()
