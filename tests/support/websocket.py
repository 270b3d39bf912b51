"""A websocket client for tests: simple_websocket's, minus one race in its handshake.

simple_websocket 1.1's client reads the server's handshake answer and takes only the first
event from that read. When the server's first message (or its close frame) arrives in the same
TCP segment as the handshake answer, as it does when the client is slow to read on a loaded
machine, that message stays in the protocol buffer until more bytes arrive: a feed that sends
one state message and then waits seemed silent (test_live failed in CI with "no message within
30 s"), and a refusal's close code was lost (1005 instead of 4401).
"""

from __future__ import annotations

import simple_websocket

ConnectionClosed = simple_websocket.ConnectionClosed


class Client(simple_websocket.Client):
    """`simple_websocket.Client` that also handles what came with the handshake answer."""

    def handshake(self) -> None:
        """Do the handshake, then take every event already read: messages go to the input buffer,
        a close frame sets the close code (the reader thread then sees the socket end)."""
        super().handshake()
        self._handle_events()
        # A close frame that came with the answer marked the socket closed; it was accepted all
        # the same, so the reader starts and ends when the server closes the TCP connection,
        # and `receive` then raises ConnectionClosed with the code that frame carried.
        self.connected = True


def connect(url: str, **kwargs) -> Client:
    """Open a websocket to `url` (keyword arguments as `simple_websocket.Client.connect`)."""
    return Client.connect(url, **kwargs)
