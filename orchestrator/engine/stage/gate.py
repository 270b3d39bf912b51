"""A stage's front door: accepts connections, runs their handshakes in bounded slots, reads frames.

Threads: one accept thread and one reader per connection. A reader answers PINGs itself (so a
stage busy with a long prefill still proves it is alive) and hands everything else to the MLX
thread through the stage's inbox:
- `("coordinator", conn)` once a coordinator's handshake verified (before it hears it is accepted);
- `("group", conn, frames, resets)` for frames from the upstream neighbour, with the number of
  RESET frames read so far (a group queued before a later RESET is stale);
- `("closed", conn)` when a connection ends.
"""

from __future__ import annotations

import errno
import queue
import socket
import threading
from collections.abc import Callable, Iterable

from orchestrator.engine import transport
from orchestrator.engine.stage.handshake_slots import HandshakeSlots, host_key
from orchestrator.engine.steptrace import StepTrace
from orchestrator.engine.wire import Frame, FrameError, HandshakeError, Kind
from orchestrator.logs import EventLogger

MAX_PENDING_HANDSHAKES = 32  # handshakes at once from hosts outside the cluster (handshake_slots.py)
ACCEPT_BACKOFF = (0.05, 1.0)  # pause after a failed accept(), doubling up to the second value
TRANSIENT_ACCEPT_ERRORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM, errno.ECONNABORTED, errno.EPROTO)


class Gate:
    """Accepts and reads a stage's connections; `pong()` builds the answer to a PING."""

    def __init__(self, listener: socket.socket, secret: bytes, max_frame: int, upstream_role: str,
                 cluster_hosts: Iterable[str], inbox: queue.SimpleQueue, pong: Callable[[], Frame],
                 log: EventLogger, stage: int | None = None) -> None:
        self.listener = listener
        self.secret = secret
        self.max_frame = max_frame
        self.upstream_role = upstream_role
        self.inbox = inbox
        self.pong = pong
        self.log = log
        # The cluster's own hosts have their handshake slots, strangers share a bounded pool.
        self._slots = HandshakeSlots(cluster_hosts, strangers=MAX_PENDING_HANDSHAKES)
        self._resets = 0
        self._resets_lock = threading.Lock()
        self._stop = threading.Event()
        # its own marks (one writer): the upstream reader notes when it has read a group (engine/steptrace.py)
        self.trace = StepTrace.of(f"stage-{stage}") if stage is not None else None

    @property
    def resets(self) -> int:
        """RESET frames read so far (an int read is atomic; only the increments take the lock)."""
        return self._resets

    def start(self) -> None:
        """Accept connections in a background thread."""
        threading.Thread(target=self._accept_loop, name="accept", daemon=True).start()

    def stop(self) -> None:
        """Stop accepting and close the listener."""
        self._stop.set()
        try:
            self.listener.close()
        except OSError:
            pass

    def _accept_loop(self) -> None:
        """Accept until stopped; no error ends it (EMFILE today may be gone in a second)."""
        pause = ACCEPT_BACKOFF[0]
        while not self._stop.is_set():
            try:
                sock, addr = self.listener.accept()
            except OSError as exc:
                if self._stop.is_set():
                    return
                transient = exc.errno in TRANSIENT_ACCEPT_ERRORS
                (self.log.warning if transient else self.log.error)("transport.accept_failed", reason=exc,
                                                                     retry_in_s=pause)
                self._stop.wait(pause)
                pause = min(pause * 2, ACCEPT_BACKOFF[1])
                continue
            pause = ACCEPT_BACKOFF[0]
            self._admit(sock, addr[0], f"{addr[0]}:{addr[1]}")

    def _admit(self, sock: socket.socket, host: str, peer: str) -> None:
        """Start a reader for a new connection, if a handshake slot is free for its host."""
        refusal, known = self._slots.acquire(host)
        if refusal:
            # Too many handshakes in progress: whoever holds them cannot starve the stage of
            # threads and descriptors, nor its own peers of slots; a real peer retries (its
            # connect backs off). Throttled: a flood of refusals once wrote 40 MB in 90 s.
            self.log.throttled("transport.refused", key=f"{host_key(host)} {refusal}", peer=peer, reason=refusal)
            sock.close()
            return
        try:
            threading.Thread(target=self._reader, args=(sock, peer, host, known), name=f"conn-{peer}",
                             daemon=True).start()
        except RuntimeError as exc:  # no thread could be started: refuse this one, keep accepting
            self._slots.release(host, known)
            sock.close()
            self.log.throttled("transport.refused", key=f"{host_key(host)} {exc}", peer=peer, reason=exc)

    def _reader(self, sock: socket.socket, peer: str, host: str, known: bool) -> None:
        adopted: list[transport.Connection] = []

        def adopt(conn: transport.Connection) -> None:
            # Queued before the peer hears it is accepted: a RESULT for a request it starts
            # right after its handshake can then never find the stage without a coordinator.
            if conn.role == "coordinator":
                adopted.append(conn)
                self.inbox.put(("coordinator", conn))

        try:
            try:
                conn = transport.accept(sock, peer, self.secret, self.max_frame, on_verified=adopt)
            finally:
                self._slots.release(host, known)
        except (HandshakeError, OSError) as exc:
            # A cluster host failing its handshake is worth a line per reason (a wrong secret, a bug).
            who = f"known {host}" if known else host_key(host)
            self.log.throttled("transport.refused", key=f"{who} {exc}"[:200], peer=peer, reason=exc)
            for c in adopted:  # verified, but the acceptance could not be sent
                self.inbox.put(("closed", c))
            return
        self._slots.learn(host)  # it proved the secret: its host's next connections are a peer's
        self.log.info("transport.accepted", peer=peer, role=conn.role)
        try:
            self._read(conn, peer)
        except FrameError as exc:
            self.log.warning("transport.malformed_frame", peer=peer, role=conn.role, reason=exc)
        except (ConnectionError, OSError) as exc:
            self.log.info("transport.closed", peer=peer, role=conn.role, reason=exc)
        finally:
            conn.close()
            self.inbox.put(("closed", conn))

    def _read(self, conn: transport.Connection, peer: str) -> None:
        """Answer PINGs, queue the upstream neighbour's groups; until the connection fails."""
        while True:
            group = conn.recv_group()
            if group[0].kind is Kind.PING:
                conn.send(self.pong())
                continue
            if conn.role != self.upstream_role:
                # Requests enter a stage only from its upstream neighbour; anyone else who
                # knows the secret may probe liveness but not drive or reset requests.
                self.log.warning("frame.unexpected_sender", peer=peer, role=conn.role,
                                 expected=self.upstream_role, kind=group[0].kind.name)
                continue
            if any(f.kind is Kind.RESET for f in group):
                with self._resets_lock:
                    self._resets += 1
            if self.trace is not None:
                self.trace.mark("read")
            self.inbox.put(("group", conn, group, self._resets))


__all__ = ["ACCEPT_BACKOFF", "Gate", "MAX_PENDING_HANDSHAKES"]
