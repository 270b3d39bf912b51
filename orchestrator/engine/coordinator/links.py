"""The coordinator's connections to its stages, each kept alive by its own thread.

A link connects (retrying with backoff), proves the cluster secret, then reads frames and
posts them to the scheduler's inbox; when the connection drops it posts `link_down` and
starts over. Only the scheduler thread sends on a link.
"""

from __future__ import annotations

import queue
import threading
import time

from orchestrator.engine import transport
from orchestrator.engine.wire import FrameError, HandshakeError
from orchestrator.logs import EventLogger

# A refused connect costs microseconds, so retry often: a replaced stage is joined within a
# tenth of a second of listening (at most 1 s before, which cost recoveries up to a second;
# then 0.25 s, on average an eighth of a second on a recovery's critical path).
RECONNECT_MAX_S = 0.1


class StageLink:
    """One stage as the coordinator sees it."""

    def __init__(self, index: int, node_id: str, address: tuple[str, int], secret: bytes,
                 max_frame: int, inbox: queue.SimpleQueue, log: EventLogger) -> None:
        self.index = index
        self.node_id = node_id
        self.address = address
        self._secret = secret
        self._max_frame = max_frame
        self._inbox = inbox
        self._log = log
        self._stop = threading.Event()
        self.conn: transport.Connection | None = None  # set and cleared by the scheduler thread

    @property
    def label(self) -> str:
        """Human-readable name for messages: `stage-1 (127.0.0.1:39602)`."""
        return f"{self.node_id} ({self.address[0]}:{self.address[1]})"

    def start(self) -> None:
        """Start the connect/read loop in a daemon thread."""
        threading.Thread(target=self._loop, name=f"link-{self.node_id}", daemon=True).start()

    def stop(self) -> None:
        """Stop reconnecting; the current connection (if any) is closed by the scheduler."""
        self._stop.set()

    def _loop(self) -> None:
        delay = 0.05
        last_error = ""
        while not self._stop.is_set():
            try:
                conn = transport.connect(self.address, self._secret, "coordinator", self._max_frame)
            except (OSError, HandshakeError) as exc:
                if str(exc) != last_error:
                    self._log.info("link.connect_failed", stage=self.node_id, reason=exc)
                    last_error = str(exc)
                self._stop.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            delay, last_error = 0.05, ""
            self._inbox.put(("link_up", self.index, conn))
            reason = self._read(conn)
            conn.close()
            self._inbox.put(("link_down", self.index, conn, reason))
            self._stop.wait(0.1)

    def _read(self, conn: transport.Connection) -> str:
        try:
            while True:
                self._inbox.put(("frames", self.index, conn.recv_group()))
        except FrameError as exc:
            return f"malformed frame: {exc}"
        except (ConnectionError, OSError) as exc:
            return str(exc) or type(exc).__name__


def now() -> float:
    """Monotonic seconds (one clock for every timeout in the engine)."""
    return time.monotonic()
