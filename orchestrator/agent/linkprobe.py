"""Measuring the links to peer agents: round-trip time and throughput, small and bounded.

A probe opens one HTTP connection to the peer's `/v1/links/echo` (authorized by a probe
ticket the peer minted for this purpose only), sends `pings` tiny requests (their median is
the HTTP round trip, software included), then two payloads (64 KiB and up to 1 MiB, each
the best of three, in turn): their time difference over their size difference is the throughput, with
the fixed per-request costs cancelled. The kernel's TCP estimate on the same socket
(TCP_INFO min_rtt) is the network's own round trip.

Then the same on the path the stage transport takes (linkecho.py): the peer opens an echo at
the address its stage will be given (`LinkPeer.transport_host`) on a port of its transport
range, and framed round trips through it give `path_rtt_ms` and the throughput the plans use
(`LinkSample.plan_rtt_ms`): the one figure of the link matrix and of the plan's boundary table. An
older peer without the echo keeps the HTTP figures. A probe moves about 4.4 MB at most.
"""

from __future__ import annotations

import http.client
import json
import socket
import statistics
import threading
import time
from collections.abc import Callable
from urllib.parse import urlsplit

from orchestrator.agent.linkecho import kernel_rtt_ms, throughput, time_path
from orchestrator.agent.netif import describe, interface_for
from orchestrator.agent.perf_schemas import LinkPeer, LinkSample, MeasureLinksRequest, NetInterface
from orchestrator.logs import EventLogger

TIMEOUT_S = 5.0


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

        def call(method: str, body: bytes | None = None, path: str = "/v1/links/echo") -> tuple[float, bytes, int]:
            t0 = time.perf_counter()
            conn.request(method, path, body=body,
                         headers={**headers, **({"Content-Type": "application/octet-stream"} if body else {})})
            r = conn.getresponse()
            data = r.read()
            return time.perf_counter() - t0, data, r.status

        def echo(method: str, body: bytes | None = None) -> float:
            took, _, status = call(method, body)
            if status != 200:
                raise ConnectionError(f"{peer.url} answered {status} to a link probe")
            return took

        times = [echo("GET") for _ in range(pings + 1)][1:]  # the first pays for the connection's warm-up
        bandwidth, floor = throughput(lambda body: echo("POST", body), payload_bytes)
        update = {"http_rtt_ms": statistics.median(times) * 1000, "rtt_ms": kernel_rtt_ms(conn.sock),
                  "bandwidth_Bps": bandwidth, "bandwidth_lower_bound": floor}
        host = peer.transport_host or parts.hostname or ""
        _, answer, status = call("POST", json.dumps({"host": host}).encode(), "/v1/links/echo-port")
        if status == 200:
            port = json.loads(answer)["port"]
            rtt, bandwidth, floor, kernel, local = time_path((host, port), json.loads(answer)["nonce"], pings,
                                                             payload_bytes)
            update.update(path_rtt_ms=rtt, path=f"{host}:{port}", bandwidth_Bps=bandwidth,
                          bandwidth_lower_bound=floor, rtt_ms=kernel)
        elif status != 404:  # 404: an older peer without the echo, its HTTP figures stand
            raise ConnectionError(f"{peer.url} cannot echo at {host}: HTTP {status} {answer[:200]!r}")
        return sample.model_copy(update={**update, "interface": describe(interface_for(local, interfaces or []))})
    except (OSError, ValueError, KeyError, http.client.HTTPException) as exc:
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
