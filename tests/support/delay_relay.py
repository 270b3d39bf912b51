"""A user-space TCP relay that adds a delay each way (for link-measurement tests).

It accepts on 127.0.0.1, dials `target` for each connection, and forwards every chunk after
`delay_ms` in each direction (order kept): the kind of relay a kernel TCP estimate does not
see past, since the kernel's round trip ends at the relay.
"""

from __future__ import annotations

import heapq
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager


def _pump(src: socket.socket, dst: socket.socket, delay_s: float) -> None:
    due: list[tuple[float, int, bytes]] = []
    cond = threading.Condition()
    done = []

    def send() -> None:
        while True:
            with cond:
                while not due and not done:
                    cond.wait()
                if not due:
                    break
                at, _, chunk = due[0]
                wait = at - time.monotonic()
                if wait > 0:
                    cond.wait(wait)
                    continue
                heapq.heappop(due)
            try:
                dst.sendall(chunk)
            except OSError:
                return
        try:
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    seq = 0
    while True:
        try:
            chunk = src.recv(1 << 16)
        except OSError:
            chunk = b""
        with cond:
            if not chunk:
                done.append(1)
                cond.notify()
                break
            seq += 1
            heapq.heappush(due, (time.monotonic() + delay_s, seq, chunk))
            cond.notify()
    sender.join(10)


@contextmanager
def delay_relay(target: tuple[str, int], delay_ms: float) -> Iterator[tuple[str, int]]:
    """A relay to `target` adding `delay_ms` each way (a round trip pays twice); yields its address."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stop = threading.Event()
    opened: list[socket.socket] = []
    pumps: list[threading.Thread] = []

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            out = socket.create_connection(target, timeout=5)
            opened.extend((conn, out))
            for s in (conn, out):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                s.settimeout(None)
            for a, b in ((conn, out), (out, conn)):
                pumps.append(threading.Thread(target=_pump, args=(a, b, delay_ms / 1000), daemon=True))
                pumps[-1].start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        for s in opened:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for t in pumps:
            t.join(5)
        for s in opened:
            s.close()
