"""Link profiles for the emulated LAN (pure): what a link between two nodes looks like.

`rtt_ms`, `jitter_ms` and `loss` are end to end between two nodes; the harness splits them
over the relays a packet crosses (each node's attachment to the bridge has one relay, so a
packet from A to B passes two, and a round trip four). `rate_bps` is each node's line rate,
enforced by the kernel (tbf) in both directions of its attachment.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinkProfile:
    """One kind of link."""

    name: str
    rtt_ms: float
    rate_bps: float | None  # None: unshaped
    jitter_ms: float = 0.0  # +/- around rtt_ms, uniform
    loss: float = 0.0  # fraction of packets lost one way

    @property
    def relayed(self) -> bool:
        """Whether packets go through the user-space relay (delay, jitter or loss to add)."""
        return self.rtt_ms > 0 or self.jitter_ms > 0 or self.loss > 0

    def per_relay(self) -> tuple[float, float, float]:
        """(delay ms, jitter ms, loss) each relay adds: a round trip crosses four relays, a
        one-way trip two."""
        return self.rtt_ms / 4, self.jitter_ms / 4, 1 - (1 - self.loss) ** 0.5


PROFILES = {p.name: p for p in (
    LinkProfile("loopback", 0.0, None),
    LinkProfile("10gbe", 0.1, 10e9),
    LinkProfile("thunderbolt", 0.06, 20e9),
    LinkProfile("1gbe", 0.3, 1e9),
    LinkProfile("wifi", 6.0, 300e6, jitter_ms=2.0, loss=0.001),
)}


def tbf_args(rate_bps: float, mtu: int) -> list[str]:
    """`tc qdisc ... tbf` arguments for a line rate: a burst of 1 ms of traffic (at least two
    frames, so a jumbo frame always passes) and a queue of 50 ms."""
    burst = max(int(rate_bps / 8 / 1000), 2 * (mtu + 64))
    return ["tbf", "rate", f"{int(rate_bps)}bit", "burst", str(burst), "latency", "50ms"]
