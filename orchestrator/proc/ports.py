"""Free TCP ports on this machine, for processes started locally (tests, demo, local pipelines)."""

from __future__ import annotations

import socket


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a listener could bind host:port now."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (another program may still take it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_port_block(n: int, prefer: int | None = None, host: str = "127.0.0.1") -> tuple[int, int]:
    """n consecutive free ports (first, last): from `prefer` when all of those are free, else anywhere."""
    if prefer is not None and all(port_free(p, host) for p in range(prefer, prefer + n)):
        return prefer, prefer + n - 1
    for _ in range(500):
        start = free_port(host)
        if start + n <= 65535 and all(port_free(p, host) for p in range(start, start + n)):
            return start, start + n - 1
    raise RuntimeError(f"no block of {n} free ports on {host}")
