"""Free TCP ports on this machine, for processes started locally (tests, demo, local pipelines).

Ports are drawn at random below the kernel's ephemeral range: a port the kernel handed out
with bind(0) lies inside that range, where any process's next outgoing connection may take it
before the listener it was meant for binds (a coordinator once failed with "Address already
in use" that way while another test suite ran beside it). Below the range only another
listener can take it, and random draws make two concurrent runs unlikely to pick the same.
"""

from __future__ import annotations

import secrets
import socket
from collections.abc import Iterator
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000  # below: ports services commonly listen on
DRAWS = 500


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a listener could bind host:port now."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
            return True
        except OSError:
            return False


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _draws(n: int) -> Iterator[int]:
    """Random first ports of n-port blocks below the ephemeral range (none if it starts too low)."""
    top = _ephemeral_start() - n
    if top > LOWEST:
        for _ in range(DRAWS):
            yield LOWEST + secrets.randbelow(top - LOWEST)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (another program may still take it)."""
    return free_port_block(1, host=host)[0]


def free_port_block(n: int, prefer: int | None = None, host: str = "127.0.0.1") -> tuple[int, int]:
    """n consecutive free ports (first, last): from `prefer` when all of those are free, else anywhere."""
    if prefer is not None and all(port_free(p, host) for p in range(prefer, prefer + n)):
        return prefer, prefer + n - 1
    for start in _draws(n):
        if all(port_free(p, host) for p in range(start, start + n)):
            return start, start + n - 1
    for _ in range(DRAWS):  # no room below the ephemeral range: the kernel's choice
        with socket.socket() as s:
            s.bind((host, 0))
            start = s.getsockname()[1]
        if start + n <= 65535 and all(port_free(p, host) for p in range(start, start + n)):
            return start, start + n - 1
    raise RuntimeError(f"no block of {n} free ports on {host}")
