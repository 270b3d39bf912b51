"""A stage's outbound connections, owned by its MLX thread: to the coordinator and to the next stage.

The coordinator's connection is the one it opened (adopted from the gate); the next stage's is
opened here on first use and again after it was lost or the next stage moved (ROUTE frames).
"""

from __future__ import annotations

import threading

from orchestrator.engine import transport
from orchestrator.engine.config import NodeSpec
from orchestrator.engine.stage_address import format_address
from orchestrator.engine.wire import Frame, FrameError, HandshakeError, Kind, json_frame
from orchestrator.logs import EventLogger
from orchestrator.proc.wait import WaitTimeout, wait_until

DOWNSTREAM_CONNECT_TIMEOUT = 5.0
DOWNSTREAM_RETRY_S = 0.1


class Links:
    """Where a stage's output goes; `send_down` reports the requests it could not pass on."""

    def __init__(self, index: int, next_node: NodeSpec | None, secret: bytes, max_frame: int,
                 log: EventLogger) -> None:
        self.index = index
        self.next_node = next_node
        self.secret = secret
        self.max_frame = max_frame
        self.log = log
        self.coordinator: transport.Connection | None = None
        self.downstream: transport.Connection | None = None

    def adopt_coordinator(self, conn: transport.Connection) -> None:
        """A coordinator's verified connection replaces the previous one."""
        if self.coordinator is not None and self.coordinator is not conn:
            self.coordinator.close()
        self.coordinator = conn

    def coordinator_closed(self, conn: transport.Connection) -> bool:
        """Forget `conn` if it is the coordinator's; True if it was."""
        if conn is not self.coordinator:
            return False
        self.coordinator = None
        return True

    def to_coordinator(self, frames: list[Frame]) -> None:
        """Send RESULT / ERROR / CACHE frames upstream to the coordinator (dropped, logged, if it is gone)."""
        if self.coordinator is None:
            self.log.warning("coordinator.absent", dropped=len(frames))
            return
        try:
            self.coordinator.send_group(frames)
        except OSError as exc:
            self.log.warning("coordinator.lost", reason=exc)

    def error(self, request_id: int, message: str) -> None:
        """Tell the coordinator a request failed here."""
        self.log.warning("request.failed", request=request_id, reason=message)
        self.to_coordinator([json_frame(Kind.ERROR, {"message": message}, request_id=request_id)])

    def send_down(self, frames: list[Frame]) -> list[int]:
        """Pass frames to the next stage; returns the ids of the requests it could not reach."""
        # Twice: a next stage that was replaced leaves a dead connection behind, noticed only
        # now; its successor listens on the same address, so one fresh connection delivers.
        for _ in range(2):
            conn = self._downstream()
            if conn is None:
                break
            try:
                conn.send_group(frames)
                return []
            except OSError as exc:
                self.log.warning("downstream.lost", peer=conn.peer, reason=exc)
                conn.close()
                self.downstream = None
        return [f.request_id for f in frames if f.kind in (Kind.FORWARD, Kind.OPEN)]

    def reroute(self, address: tuple[str, int]) -> None:
        """The next stage moved to `address`: later frames go there."""
        if self.next_node is None or address == self.next_node.host_port:
            return
        old = self.next_node.address
        self.next_node = self.next_node.model_copy(update={"address": format_address(address)})
        if self.downstream is not None:  # it leads to where the stage used to be
            self.downstream.close()
            self.downstream = None
        self.log.info("downstream.moved", peer=self.next_node.address, was=old)

    def _downstream(self) -> transport.Connection | None:
        if self.downstream is not None:
            return self.downstream
        node = self.next_node
        assert node is not None
        try:
            self.downstream = wait_until(
                lambda: transport.connect(node.host_port, self.secret, f"stage-{self.index}", self.max_frame),
                DOWNSTREAM_CONNECT_TIMEOUT, DOWNSTREAM_RETRY_S, f"stage {node.id} at {node.address}",
                ignore=(OSError, HandshakeError))
        except WaitTimeout as exc:
            self.log.warning("downstream.unreachable", peer=node.address, reason=exc)
            return None
        self.log.info("downstream.connected", peer=node.address)
        threading.Thread(target=_drain, args=(self.downstream,), daemon=True).start()
        return self.downstream


def _drain(conn: transport.Connection) -> None:
    """Read (and discard) whatever the next stage sends, so a closed peer is noticed."""
    try:
        while True:
            conn.recv()
    except (ConnectionError, OSError, FrameError):
        conn.close()


__all__ = ["DOWNSTREAM_CONNECT_TIMEOUT", "Links"]
