"""Free ports chosen at run time: never fixed well-known ones (other processes may hold 9190/9090)."""
import socket
import threading

# A port is free when picked and taken later by a child process (the tracker, a server). Fleets that
# start at once (several shares) pick ports while each other's children are still starting, and the
# kernel may hand a just-freed port out again: so this process never hands out a port twice.
_handed_out: set[int] = set()
_lock = threading.Lock()


def free_port(host: str = "127.0.0.1") -> int:
    with _lock:
        while True:
            with socket.socket() as sock:
                sock.bind((host, 0))
                port = sock.getsockname()[1]
            if port not in _handed_out:
                _handed_out.add(port)
                return port
