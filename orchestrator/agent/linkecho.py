"""Measuring a link on the path the stage transport takes: a raw TCP echo at the stage's address.

A stage is reached at the address its plan gives it (`planner/transport.py`: the registry's
address, or a Thunderbolt bridge's) on a port of its node's transport range, over a plain TCP
socket carrying length-prefixed frames (`engine/transport.py`). The agent's HTTP API may be
reached another way (another interface, another route), and the kernel's TCP round-trip
estimate sees only the first hop of a user-space relay. So the peer opens, on request, a
one-connection echo listener at that address on a free port of its transport range (the
highest, so the lowest ones the plans give to stages stay free), and the prober times framed
round trips through it: what a hidden state crossing a stage boundary pays, relays included.

Wire: the client sends the 32-byte nonce the peer handed out, then frames `!I length` +
payload; the listener answers each whole frame with `!I length`. It closes after one
connection, or `ACCEPT_S` without one.
"""

from __future__ import annotations

import secrets
import socket
import statistics
import struct
import threading
import time
from collections.abc import Callable

ACCEPT_S = 10.0  # an echo listener nobody dials closes by itself
IO_TIMEOUT_S = 5.0
NONCE_BYTES = 32
_LEN = struct.Struct("!I")
SMALL_PAYLOAD = 64 << 10
MIN_DIFFERENCE_S = 1e-4  # two payloads' times closer than this cannot tell a throughput
_TCPI_RTT, _TCPI_MIN_RTT = 68, 148  # byte offsets in Linux's struct tcp_info (microseconds)


def kernel_rtt_ms(sock: socket.socket) -> float | None:
    """The kernel's smallest round trip seen on this TCP connection (Linux), else None: the
    network's own, but only to the first hop a user-space relay ends."""
    if not hasattr(socket, "TCP_INFO"):
        return None
    try:
        raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
    except OSError:
        return None
    offset = _TCPI_MIN_RTT if len(raw) >= _TCPI_MIN_RTT + 4 else _TCPI_RTT
    if len(raw) < offset + 4:
        return None
    (us,) = struct.unpack_from("I", raw, offset)
    return us / 1000 if us else None


class EchoUnavailable(Exception):
    """No echo listener could be opened (the address is not this node's, or no port is free)."""


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(min(n - got, 1 << 20))
        if not chunk:
            raise ConnectionError("the link echo closed mid-frame")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def open_echo(host: str, ports: tuple[int, int], max_frame: int,
              slots: threading.BoundedSemaphore | None = None) -> tuple[int, str]:
    """Bind a one-connection echo listener at `host` on the highest free port of `ports`
    (inclusive); (port, nonce hex). Serves in a daemon thread; raises EchoUnavailable. With
    `slots`, one is held while the echo is open and none free refuses: a probe ticket cannot
    fill the transport range the stages need."""
    if slots is not None and not slots.acquire(blocking=False):
        raise EchoUnavailable("every link echo of this node is in use; probe again shortly")
    try:
        port, nonce = _bind(host, ports, max_frame, slots)
    except BaseException:
        if slots is not None:
            slots.release()
        raise
    return port, nonce


def _bind(host: str, ports: tuple[int, int], max_frame: int,
          slots: threading.BoundedSemaphore | None) -> tuple[int, str]:
    sock = None
    for port in range(ports[1], ports[0] - 1, -1):
        candidate = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        try:
            candidate.bind((host, port))
        except OSError as exc:
            candidate.close()
            if exc.errno == 99:  # EADDRNOTAVAIL: not an address of this node, no port will do
                raise EchoUnavailable(f"{host} is not an address of this node") from None
            continue
        sock = candidate
        break
    if sock is None:
        raise EchoUnavailable(f"no free port in {ports[0]}-{ports[1]} on {host}")
    sock.listen(1)
    sock.settimeout(ACCEPT_S)
    nonce = secrets.token_bytes(NONCE_BYTES)
    port = sock.getsockname()[1]
    threading.Thread(target=_serve, args=(sock, nonce, max_frame, slots), daemon=True, name="link-echo").start()
    return port, nonce.hex()


def _serve(listener: socket.socket, nonce: bytes, max_frame: int, slots: threading.BoundedSemaphore | None) -> None:
    try:
        _echo(listener, nonce, max_frame)
    finally:
        if slots is not None:
            slots.release()


def _echo(listener: socket.socket, nonce: bytes, max_frame: int) -> None:
    try:
        conn, _ = listener.accept()
    except OSError:
        listener.close()
        return
    listener.close()  # one connection: the port is free again for the stages
    with conn:
        conn.settimeout(IO_TIMEOUT_S)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            if not secrets.compare_digest(_recv_exact(conn, NONCE_BYTES), nonce):
                return
            while True:
                head = conn.recv(_LEN.size, socket.MSG_WAITALL)
                if len(head) < _LEN.size:
                    return
                (n,) = _LEN.unpack(head)
                if n > max_frame:
                    return
                _recv_exact(conn, n)
                conn.sendall(_LEN.pack(n))
        except OSError:
            return


def throughput(send: Callable[[bytes], float], payload_bytes: int) -> tuple[float, bool]:
    """(B/s, only a lower bound) from timing a small and a big payload with `send` (seconds each):
    their time difference over their size difference, the fixed per-send costs cancelled. Best of
    three each, taken in turn: a burst of other load that slowed only the small ones would shrink the
    difference and read as more than the line rate (7 Gbit/s through a 1 Gbit/s cap at load 10).
    Below the timer's resolution the difference is noise: the throughput is then only known to be
    at least what the resolution allows (said so, not a clamp shown as 7,864 Gbit/s)."""
    small, big = bytes(SMALL_PAYLOAD), bytes(max(payload_bytes, 2 * SMALL_PAYLOAD))
    pairs = [(send(small), send(big)) for _ in range(3)]
    t_small, t_big = min(s for s, _ in pairs), min(b for _, b in pairs)
    return (len(big) - len(small)) / max(t_big - t_small, MIN_DIFFERENCE_S), t_big - t_small < MIN_DIFFERENCE_S


def time_path(address: tuple[str, int], nonce_hex: str, pings: int, payload_bytes: int
              ) -> tuple[float, float, bool, float | None, str]:
    """(round trip ms, throughput B/s, throughput only a lower bound, kernel RTT ms, the local
    address the path leaves from) through
    the echo at `address`: the median of `pings` one-byte frames (after one to warm up), and
    two payload sizes whose difference cancels the fixed per-frame costs (`throughput`)."""
    with socket.create_connection(address, timeout=IO_TIMEOUT_S) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(bytes.fromhex(nonce_hex))

        def frame(payload: bytes) -> float:
            t0 = time.perf_counter()
            sock.sendall(_LEN.pack(len(payload)) + payload)
            if _LEN.unpack(_recv_exact(sock, _LEN.size))[0] != len(payload):
                raise ConnectionError("the link echo answered another length")
            return time.perf_counter() - t0

        times = [frame(b"x") for _ in range(pings + 1)][1:]
        bandwidth, floor = throughput(frame, payload_bytes)
        return statistics.median(times) * 1000, bandwidth, floor, kernel_rtt_ms(sock), sock.getsockname()[0]
