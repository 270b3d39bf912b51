"""Measuring the links to peer agents: round-trip time and throughput, small and bounded.

A probe opens one HTTP connection to the peer's `/v1/links/echo` (authorized by a probe
ticket the peer minted for this purpose only), sends `pings` tiny requests (their median is
the HTTP round trip, software included), then two payloads (64 KiB and up to 1 MiB, each
the best of two): their time difference over their size difference is the throughput, with
the fixed per-request costs cancelled. The kernel's TCP estimate on the same socket
(TCP_INFO min_rtt) is the network's own round trip. A probe moves about 2.2 MB at most.
"""

from __future__ import annotations

import http.client
import socket
import statistics
import struct
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from ..logs import EventLogger
from .netif import describe, interface_for
from .perf_schemas import LinkPeer, LinkSample, MeasureLinksRequest, NetInterface

SMALL_PAYLOAD = 64 << 10
TIMEOUT_S = 5.0
_TCPI_RTT, _TCPI_MIN_RTT = 68, 148  # byte offsets in Linux's struct tcp_info (microseconds)


def kernel_rtt_ms(sock: socket.socket) -> float | None:
    """The kernel's smallest round trip seen on this TCP connection (Linux), else None."""
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


def probe(peer: LinkPeer, pings: int = 8, payload_bytes: int = 1 << 20,
          interfaces: list[NetInterface] | None = None) -> LinkSample:
    """Measure the link to one peer; a failure is reported in the sample, never raised."""
    parts = urlsplit(peer.url)
    sample = LinkSample(node_id=peer.node_id, name=peer.name, url=peer.url, at=time.time())
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port or 80, timeout=TIMEOUT_S)
    headers = {"Authorization": f"Bearer {peer.ticket}"}
    try:
        conn.connect()
        conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        local = conn.sock.getsockname()[0]

        def call(method: str, body: bytes | None = None) -> float:
            t0 = time.perf_counter()
            conn.request(method, "/v1/links/echo", body=body,
                         headers={**headers, **({"Content-Type": "application/octet-stream"} if body else {})})
            r = conn.getresponse()
            r.read()
            if r.status != 200:
                raise ConnectionError(f"{peer.url} answered {r.status} to a link probe")
            return time.perf_counter() - t0

        times = [call("GET") for _ in range(pings + 1)][1:]  # the first pays for the connection's warm-up
        small, big = bytes(SMALL_PAYLOAD), bytes(max(payload_bytes, 2 * SMALL_PAYLOAD))
        t_small = min(call("POST", small) for _ in range(2))
        t_big = min(call("POST", big) for _ in range(2))
        bandwidth = (len(big) - len(small)) / max(t_big - t_small, 1e-6)
        return sample.model_copy(update={
            "http_rtt_ms": statistics.median(times) * 1000, "rtt_ms": kernel_rtt_ms(conn.sock),
            "bandwidth_Bps": bandwidth, "interface": describe(interface_for(local, interfaces or []))})
    except (OSError, http.client.HTTPException) as exc:
        return sample.model_copy(update={"error": f"{type(exc).__name__}: {exc}"})
    finally:
        conn.close()


class LinkProber:
    """The peers this node was asked to measure, the last result for each, and the period."""

    def __init__(self, log: EventLogger, interfaces: Callable[[], list[NetInterface]]) -> None:
        self._log = log
        self._interfaces = interfaces
        self._lock = threading.Lock()  # guards the request and the results
        self._probing = threading.Lock()  # one measurement round at a time
        self._request: MeasureLinksRequest | None = None
        self._results: dict[str, LinkSample] = {}
        self._next_at = 0.0

    def measure(self, request: MeasureLinksRequest) -> list[LinkSample]:
        """Probe every peer now (one after the other: probes must not compete for the link),
        remember them for the periodic re-measurement, and return the results."""
        with self._lock:
            self._request = request
            self._next_at = time.monotonic() + request.interval_s
        return self._round(request)

    def _round(self, request: MeasureLinksRequest) -> list[LinkSample]:
        with self._probing:
            found = self._interfaces()
            samples = [probe(p, request.pings, request.payload_bytes, found) for p in request.peers]
        with self._lock:
            self._results = {s.node_id: s for s in samples}
        for s in samples:
            self._log.info("links.measured", peer=s.name or s.node_id, rtt_ms=s.rtt_ms, http_rtt_ms=s.http_rtt_ms,
                           bandwidth_Bps=s.bandwidth_Bps, error=s.error)
        return samples

    def tick(self) -> None:
        """Re-measure when the period is up (called now and then by the agent)."""
        with self._lock:
            request = self._request
            due = request is not None and time.monotonic() >= self._next_at
            if due:
                self._next_at = time.monotonic() + request.interval_s
        if due and request is not None:
            self._round(request)

    def links(self) -> list[LinkSample]:
        """The last sample per peer."""
        with self._lock:
            return list(self._results.values())
