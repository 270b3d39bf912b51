"""TCP connections between pipeline peers: handshake, framed send and receive.

A Connection has one reader (the thread that owns it) and any number of senders, which a
lock serialises so frames of a micro-batch are never interleaved with another sender's.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import Callable

from orchestrator.engine import wire
from orchestrator.engine.wire import Flag, Frame, FrameError, HandshakeError

HANDSHAKE_TIMEOUT = 5.0  # for the WHOLE handshake, however slowly its bytes trickle in
_MORE = int(Flag.MORE)  # tested on every frame read: an int test, not an IntFlag operation


def recv_exact(sock: socket.socket, n: int) -> bytes:
    """Read exactly n bytes or raise ConnectionError on end of stream."""
    # One call in the usual case: MSG_WAITALL blocks until all n bytes are in (a frame's header
    # or payload), where a loop of recv_into calls costs a syscall and a copy each.
    data = sock.recv(n, socket.MSG_WAITALL)
    if len(data) == n:
        return data
    # Short: the peer closed, a signal arrived, or the socket has a timeout (non-blocking
    # underneath, so WAITALL returns what was there): finish with plain reads.
    buf = bytearray(data)
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"peer closed the connection ({len(buf)} of {n} bytes read)")
        buf += chunk
    return bytes(buf)


def send_parts(sock: socket.socket, parts: list) -> int:
    """Send byte strings and views in order, in as few calls as the kernel allows; returns the bytes sent.

    A gathered send: a tensor's payload (a view of its array) goes out without being copied into
    one string with the headers first (a copy that, right after a step, also paid for the heap
    housekeeping of everything the step freed)."""
    sizes = [wire.payload_size(p) for p in parts]  # (an mlx array's len() is its first dimension)
    total = sum(sizes)
    while parts:
        sent = sock.sendmsg(parts)
        while parts and sent >= sizes[0]:
            sent -= sizes[0]
            parts, sizes = parts[1:], sizes[1:]
        if sent:
            parts = [memoryview(parts[0]).cast("B")[sent:], *parts[1:]]
            sizes[0] -= sent
    return total


def _recv_by(sock: socket.socket, n: int, deadline: float) -> bytes:
    """recv_exact, but the whole read must end by `deadline` (a per-read timeout alone lets a
    peer hold the connection forever by sending one byte just before each timeout)."""
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"handshake timed out ({len(buf)} of {n} bytes read)")
        sock.settimeout(left)
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError(f"peer closed the connection ({len(buf)} of {n} bytes read)")
        buf += chunk
    return bytes(buf)


def _tune(sock: socket.socket) -> None:
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)


class Connection:
    """An authenticated peer connection carrying frames."""

    def __init__(self, sock: socket.socket, peer: str, role: str, max_frame_bytes: int) -> None:
        self.sock = sock
        self.peer = peer
        self.role = role
        self.max_frame_bytes = max_frame_bytes
        self._send_lock = threading.Lock()
        self.bytes_sent = 0
        self.bytes_received = 0

    def send(self, *frames: Frame) -> None:
        """Send frames atomically with respect to other senders."""
        parts = []
        for f in frames:
            parts.append(wire.header(f))
            if wire.payload_size(f.payload):
                parts.append(f.payload)
        with self._send_lock:
            self.bytes_sent += send_parts(self.sock, parts)

    def send_group(self, frames: list[Frame]) -> None:
        """Send frames as one micro-batch: MORE on all but the last."""
        last = len(frames) - 1
        self.send(*[f.with_more(i < last) for i, f in enumerate(frames)])

    def recv(self) -> Frame:
        """Read one frame; FrameError for malformed input, ConnectionError on close."""
        head, length = wire.decode_header(recv_exact(self.sock, wire.HEADER_SIZE), self.max_frame_bytes)
        self.bytes_received += wire.HEADER_SIZE + length
        return head._replace(payload=recv_exact(self.sock, length)) if length else head

    def recv_group(self) -> list[Frame]:
        """Read frames up to and including the first without the MORE flag."""
        group = [self.recv()]
        while int(group[-1].flags) & _MORE:
            if len(group) >= wire.MAX_GROUP:
                raise FrameError(f"micro-batch longer than {wire.MAX_GROUP} frames")
            group.append(self.recv())
        return group

    def close(self) -> None:
        """Close the socket; safe to call twice and from any thread."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def connect(address: tuple[str, int], secret: bytes, role: str, max_frame_bytes: int,
            timeout: float = HANDSHAKE_TIMEOUT) -> Connection:
    """Open a connection to a stage and prove the cluster secret; raises OSError or HandshakeError."""
    sock = socket.create_connection(address, timeout=timeout)
    try:
        _tune(sock)
        server_nonce = wire.parse_server_hello(recv_exact(sock, 6 + wire.NONCE))
        client_nonce = wire.new_nonce()
        sock.sendall(wire.client_proof(secret, role, server_nonce, client_nonce))
        wire.verify_server(secret, server_nonce, client_nonce, recv_exact(sock, 36))
        sock.settimeout(None)
    except BaseException:
        sock.close()
        raise
    return Connection(sock, f"{address[0]}:{address[1]}", role, max_frame_bytes)


def accept(sock: socket.socket, peer: str, secret: bytes, max_frame_bytes: int,
           timeout: float = HANDSHAKE_TIMEOUT,
           on_verified: Callable[[Connection], None] | None = None) -> Connection:
    """Run the server side of the handshake on an accepted socket; raises HandshakeError.

    The whole exchange must end within `timeout` seconds of the call.

    `on_verified(conn)` runs once the peer has proved the secret but before it is told so:
    whatever it queues is ordered before anything the peer can cause after its handshake
    completes (a stage adopts its coordinator there, so no RESULT can miss it).
    """
    deadline = time.monotonic() + timeout
    try:
        _tune(sock)
        sock.settimeout(timeout)
        nonce = wire.new_nonce()
        sock.sendall(wire.server_hello(nonce))
        head = _recv_by(sock, 7, deadline)
        rest_len = wire.rest_length(head) if head[:4] == b"PSHC" else 0
        rest = _recv_by(sock, rest_len, deadline) if rest_len else b""
        role, client_nonce = wire.verify_client(secret, nonce, head, rest)
        conn = Connection(sock, peer, role, max_frame_bytes)
        if on_verified is not None:
            on_verified(conn)
        sock.settimeout(max(0.001, deadline - time.monotonic()))
        sock.sendall(wire.server_proof(secret, nonce, client_nonce))
        sock.settimeout(None)
    except (OSError, HandshakeError):
        sock.close()
        raise
    except Exception as exc:  # noqa: BLE001 (anything unexpected from a hostile peer is a refusal, not a crash)
        sock.close()
        raise HandshakeError(str(exc)) from None
    return conn


def bind(host: str, port: int) -> socket.socket:
    """Bind exactly (host, port) without listening yet: connections are refused until `listen()`."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


__all__ = ["Connection", "FrameError", "HandshakeError", "accept", "bind", "connect", "recv_exact", "send_parts"]
