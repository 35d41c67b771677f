"""Free ports chosen at run time: never fixed well-known ones (other processes may hold 9190/9090)."""
import socket


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
