"""A TVM RPC runner server that serves sessions in one warm process.

Stock `tvm.exec.rpc_server` starts a new process for every session: in fork mode that breaks
CUDA (the child inherits an initialised driver), in --no-fork mode each measurement pays ~8 s of
Python start-up and TVM import. This server speaks the same tracker/RPC protocol but runs each
session in-process, so the CUDA context (under its MPS share) stays warm. A candidate that kills
the process is reported to the client as a failed trial; the fleet supervisor restarts the server.

Authentication (see docs/running.md, "Security"): TVM's RPC server runs whatever code a client sends it.
With a shared secret (env TUNEKIT_RPC_SECRET, set by the fleet; never on the command line), a
client must prove it knows the secret in the connection handshake, before the RPC session starts
and therefore before anything can be uploaded or loaded:
- the server registers a random one-time match key with the tracker (`<key>:<128 random bits>`,
  a fresh one after every session and every refused connection);
- the client obtains it from the tracker and connects with the key
  `client:<matchkey> -tunekit-auth=<HMAC-SHA256(secret, "tunekit-rpc-auth-v1" + matchkey)>`;
- the server compares the HMAC (constant time) and answers TVM's "key mismatch" code otherwise,
  closes the socket, and keeps serving: the right client is not locked out.
The tag is bound to a match key the server made and uses once, so a tag seen on the wire cannot
be replayed. The TCP stream itself is not encrypted. Without a secret the server only listens
on a loopback address (it refuses to start otherwise).

Run: python -m tunekit.servers.warm_server --tracker HOST:PORT --key KEY --host 127.0.0.1 --port P
"""
from __future__ import annotations

import argparse
import hashlib
import hmac
import logging
import os
import secrets
import select
import socket
import struct
import sys
import threading
import time

SECRET_ENV = "TUNEKIT_RPC_SECRET"
AUTH_OPT = "-tunekit-auth="
_AUTH_CONTEXT = b"tunekit-rpc-auth-v1\0"
_HANDSHAKE_TIMEOUT_S = 10.0  # a peer that connects and says nothing cannot block the server

log = logging.getLogger("tunekit.warm_server")


def auth_tag(secret: bytes, matchkey: str) -> str:
    return hmac.new(secret, _AUTH_CONTEXT + matchkey.encode(), hashlib.sha256).hexdigest()


def client_key(matchkey: str, secret: bytes | None) -> str:
    """The key a client passes to `rpc.connect` for a server's match key (with the proof if a secret is set)."""
    return f"{matchkey} {AUTH_OPT}{auth_tag(secret, matchkey)}" if secret else matchkey


def redact(text: str) -> str:
    """An error message from `rpc.connect` repeats the key: drop the tag before it reaches a log."""
    import re

    return re.sub(re.escape(AUTH_OPT) + r"[0-9a-f]+", AUTH_OPT + "<redacted>", text)


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        try:
            return all(ipaddress.ip_address(info[4][0]).is_loopback
                       for info in socket.getaddrinfo(host, None))
        except (OSError, ValueError):
            return False


def _device_healthy() -> bool:
    import tvm

    try:
        device = tvm.cuda(0)
        tvm.runtime.empty((1,), "float32", device)
        device.sync()
        return True
    except Exception:
        return False


def exit_with_parent() -> None:
    """Exit when the process that started us is gone (a SIGKILLed `tunekit tune` leaves no server behind)."""
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(1.0)
            if os.getppid() != parent:
                os._exit(0)

    threading.Thread(target=watch, daemon=True, name="tunekit-parent-watch").start()


def _register(tracker_conn, rpc_key: str, port: int, custom_addr, matchkey: str) -> None:
    from tvm.rpc import base

    base.sendjson(tracker_conn, [base.TrackerCode.PUT, rpc_key, (port, matchkey), custom_addr])
    assert base.recvjson(tracker_conn) == base.TrackerCode.SUCCESS


def _new_matchkey(rpc_key: str) -> str:
    # Same shape as TVM's base.random_key (the tracker splits it at the last ':'), but unguessable.
    return f"{rpc_key}:{secrets.token_hex(16)}"


def _accept_session(listen_sock, tracker_conn, rpc_key: str, port: int, custom_addr, secret: bytes | None,
                    ping_period: float = 2.0):
    """TVM's `_accept_conn` (rpc/server.py) with the secret checked in the handshake. Returns (conn, addr)
    of an accepted client; refused ones are answered with RPC_CODE_MISMATCH and closed."""
    from tvm.rpc import base

    matchkey = _new_matchkey(rpc_key)
    _register(tracker_conn, rpc_key, port, custom_addr, matchkey)
    unmatched_periods = 0
    while True:
        ready, _, _ = select.select([listen_sock], [], [], ping_period)
        if listen_sock not in ready:
            # A client took the key from the tracker but never came: offer a new one after a while.
            base.sendjson(tracker_conn, [base.TrackerCode.GET_PENDING_MATCHKEYS])
            pending = base.recvjson(tracker_conn)
            unmatched_periods = 0 if matchkey in pending else unmatched_periods + 1
            if unmatched_periods * ping_period > 4 + ping_period:
                matchkey = _new_matchkey(rpc_key)
                _register(tracker_conn, rpc_key, port, custom_addr, matchkey)
                unmatched_periods = 0
            continue
        conn, addr = listen_sock.accept()
        conn.settimeout(_HANDSHAKE_TIMEOUT_S)
        try:
            magic = struct.unpack("<i", base.recvall(conn, 4))[0]
            if magic != base.RPC_MAGIC:
                conn.close()
                continue
            keylen = struct.unpack("<i", base.recvall(conn, 4))[0]
            if not 0 < keylen <= 4096:
                conn.close()
                continue
            words = base.recvall(conn, keylen).decode("utf-8", "replace").split()
        except (OSError, struct.error, RuntimeError):
            conn.close()
            continue
        refusal = None
        if not words or words[0] != "client:" + matchkey:
            refusal = "unknown match key"
        elif secret is not None:
            tags = [w[len(AUTH_OPT):] for w in words[1:] if w.startswith(AUTH_OPT)]
            if not tags:
                refusal = "no secret proof (client without --rpc-secret-file / TUNEKIT_RPC_SECRET?)"
            elif not hmac.compare_digest(tags[0], auth_tag(secret, matchkey)):
                refusal = "wrong secret"
        if refusal is not None:
            try:
                conn.sendall(struct.pack("<i", base.RPC_CODE_MISMATCH))
            except OSError:
                pass
            conn.close()
            log.warning("refused a session from %s: %s", addr[0], refusal)
            if words and words[0] == "client:" + matchkey:
                # The key was spent on a refused peer: register a fresh one for the right client.
                matchkey = _new_matchkey(rpc_key)
                _register(tracker_conn, rpc_key, port, custom_addr, matchkey)
            continue
        server_key = "server:" + rpc_key
        conn.sendall(struct.pack("<i", base.RPC_CODE_SUCCESS))
        conn.sendall(struct.pack("<i", len(server_key)))
        conn.sendall(server_key.encode("utf-8"))
        conn.settimeout(None)
        return conn, addr


def _listen_loop(listen_sock, port: int, rpc_key: str, tracker_addr, custom_addr, secret, serve) -> None:
    """TVM's `_listen_loop` (tracker registration and reporting), with `_accept_session` for the handshake."""
    from tvm.rpc import base

    tracker_conn = None
    while True:
        try:
            if tracker_conn is None:
                # started beside its tracker (servers.fleet): TVM's default retries every 5 s
                tracker_conn = base.connect_with_retry(tracker_addr, retry_period=0.1)
                tracker_conn.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
                if struct.unpack("<i", base.recvall(tracker_conn, 4))[0] != base.RPC_TRACKER_MAGIC:
                    raise RuntimeError(f"{tracker_addr!s} is not an RPC tracker")
                base.sendjson(tracker_conn, [base.TrackerCode.UPDATE_INFO,
                                             {"key": "server:" + rpc_key, "addr": (custom_addr, port)}])
                assert base.recvjson(tracker_conn) == base.TrackerCode.SUCCESS
            conn, addr = _accept_session(listen_sock, tracker_conn, rpc_key, port, custom_addr, secret)
        except OSError:
            if tracker_conn is not None:  # the tracker went away: register again when it is back
                tracker_conn.close()
                tracker_conn = None
            continue
        serve(conn, addr)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tracker", required=True)
    parser.add_argument("--key", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--listen-fd", type=int, help="serve this listening socket (bound to --port by the parent)")
    parser.add_argument("--check-cuda", action="store_true", help="exit when a session leaves the CUDA context broken")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    secret = os.environ.pop(SECRET_ENV, "").encode() or None  # not inherited by anything we start
    if secret is None and not is_loopback(args.host):
        sys.exit(f"tunekit warm server: refusing to listen on {args.host} without a secret "
                 f"({SECRET_ENV}): TVM RPC runs any code it is sent")
    exit_with_parent()

    from tvm.rpc import server as rpc_server
    from tvm.support import utils

    from . import input_fill, output_check

    input_fill.register()  # a candidate's inputs are filled here, every element
    output_check.register()  # a candidate's output is compared here, not copied to the client

    def serve_in_process(sock, addr):
        work_path = utils.tempdir()
        old_cwd = os.getcwd()
        os.chdir(work_path.path)  # keep sessions' files apart
        try:
            rpc_server._serve_loop(sock, None, work_path)
        finally:
            os.chdir(old_cwd)
            work_path.remove()
            sock.detach()  # ServerLoop owns and has closed the fd; closing it again could hit a reused fd
            if args.check_cuda and not _device_healthy():
                # A candidate corrupted the CUDA context (illegal address, ...): every later session
                # would fail too. Exit before re-registering; the fleet supervisor starts a fresh server.
                os._exit(3)

    tracker_host, tracker_port = args.tracker.rsplit(":", 1)
    if args.listen_fd is not None:
        listen = socket.socket(fileno=args.listen_fd)
    else:
        listen = socket.socket(socket.AF_INET6 if ":" in args.host else socket.AF_INET, socket.SOCK_STREAM)
        listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listen.bind((args.host, args.port))
        listen.listen(4)
    # A wildcard address is no address to connect to: let the tracker report the one it sees.
    custom_addr = None if args.host in ("0.0.0.0", "::", "") else args.host
    _listen_loop(listen, args.port, args.key, (tracker_host, int(tracker_port)), custom_addr, secret,
                 serve_in_process)


if __name__ == "__main__":
    main()
