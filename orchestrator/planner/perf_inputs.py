"""What the performance model is fed: a node's timing of a model's layers, a measured link.

Both come from the node agents (compute profiles and link probes) through their reports;
the planner only reads them. Times are milliseconds, bandwidth bytes per second.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LayerTiming(BaseModel):
    """One node's timing of one model (per layer, plus the final norm and head).

    `*_solo` steps run with every core (the coordinator's SOLO flag: nothing else is in
    flight), the others with the stage's base thread count, as a stage runs them.
    """

    model_config = ConfigDict(frozen=True)

    node_id: str = ""  # whose hardware it was measured on (a copy assumed for another node keeps it)
    batch: int = Field(default=8, ge=2)  # B of the `*_bB` numbers
    layer_ms_b1_solo: float = Field(ge=0)  # one decode step, 1 request, all cores
    layer_ms_b1: float = Field(ge=0)  # one decode step, 1 request, base threads
    layer_ms_bB: float = Field(ge=0)  # one decode step of B requests together, base threads
    head_ms_b1_solo: float = Field(default=0.0, ge=0)  # final norm + head + sampling
    head_ms_b1: float = Field(default=0.0, ge=0)
    head_ms_bB: float = Field(default=0.0, ge=0)
    # The same step at row counts between 1 and B, (rows, ms) pairs: cost is not linear in
    # rows (a batched step has fixed costs a 1-row step does not, and 2-4 rows cost most of
    # what 8 do: measured 1 -> 2 -> 4 -> 8 rows 63 -> 69 -> 80 -> 87 ms on a 15-layer stage
    # with the head, where the line from 1 to 8 gave 66 and 73). Empty in older profiles:
    # the line from 1 to B.
    layer_ms_rows: tuple[tuple[int, float], ...] = ()
    head_ms_rows: tuple[tuple[int, float], ...] = ()
    prefill_ms_per_token: float = Field(ge=0)  # per layer, per prompt token, at context 0 (all cores)
    # Attention makes later prompt tokens dearer: extra ms per layer per token per 1000
    # tokens already in the cache.
    prefill_ms_per_token_per_k: float = Field(default=0.0, ge=0)
    # What a decode step costs beyond the layer math, timed through the real code on the node
    # (engine/profiling/step.py): a stage passing hidden states on (frames in and out, the inbox
    # handoff, conversions, bookkeeping), the last stage (sampling's encode, RESULT frames),
    # and the coordinator (results in, token events to the streaming threads, frames out).
    # 0 in profiles taken before they were measured: the prediction then falls back to
    # predict.COORDINATOR_MS for the coordinator and adds nothing per stage.
    step_ms_b1: float = Field(default=0.0, ge=0)
    step_ms_bB: float = Field(default=0.0, ge=0)
    last_step_ms_b1: float = Field(default=0.0, ge=0)
    last_step_ms_bB: float = Field(default=0.0, ge=0)
    coordinator_ms_b1: float = Field(default=0.0, ge=0)
    coordinator_ms_bB: float = Field(default=0.0, ge=0)

    def layer_ms(self, rows: int, solo: bool = False) -> float:
        """One layer's decode step for `rows` requests together (piecewise linear through the
        measured row counts; past B along the last piece)."""
        if rows <= 1:
            return self.layer_ms_b1_solo if solo else self.layer_ms_b1
        return _through([(1, self.layer_ms_b1), *self.layer_ms_rows, (self.batch, self.layer_ms_bB)], rows)

    def head_ms(self, rows: int, solo: bool = False) -> float:
        """The last stage's norm, head and sampling for `rows` requests."""
        if rows <= 1:
            return self.head_ms_b1_solo if solo else self.head_ms_b1
        return _through([(1, self.head_ms_b1), *self.head_ms_rows, (self.batch, self.head_ms_bB)], rows)

    def step_overhead_ms(self, rows: int, last: bool) -> float:
        """A stage's own per-step path for `rows` requests, its layers excepted."""
        if last:
            return _between(self.last_step_ms_b1, self.last_step_ms_bB, rows, self.batch)
        return _between(self.step_ms_b1, self.step_ms_bB, rows, self.batch)

    def coordinator_ms(self, rows: int) -> float:
        """The coordinator's work per decode step of `rows` requests (0: not measured)."""
        return _between(self.coordinator_ms_b1, self.coordinator_ms_bB, rows, self.batch)

    def prefill_ms(self, start: int, tokens: int) -> float:
        """One layer's prefill of prompt tokens [start, start + tokens) (already cached: start)."""
        # Every token of a chunk is scored against all start + tokens keys: masked attention
        # computes the whole chunk x keys square (measured: a 1k-token chunk costs about half
        # per token what a 2k one does at context 0, not three quarters).
        keys = start + tokens
        return tokens * (self.prefill_ms_per_token + self.prefill_ms_per_token_per_k * keys / 1000)


def _through(points: list[tuple[int, float]], rows: int) -> float:
    """Piecewise linear through (rows, ms) points, extended past the last along its last piece."""
    pts = sorted({r: ms for r, ms in points}.items())
    for (r0, y0), (r1, y1) in zip(pts, pts[1:]):
        if rows <= r1 or (r1, y1) == pts[-1]:
            return max(0.0, y0 + (y1 - y0) * (rows - r0) / (r1 - r0))
    return pts[-1][1]


def _between(at_1: float, at_b: float, rows: int, batch: int) -> float:
    """Linear in rows through (1, at_1) and (batch, at_b); per-row costs go on past B."""
    return max(0.0, at_1 + (at_b - at_1) * (max(1, rows) - 1) / (batch - 1))


class LinkCost(BaseModel):
    """A measured (or assumed) link between two nodes."""

    model_config = ConfigDict(frozen=True)

    rtt_ms: float = Field(ge=0)
    bandwidth_Bps: float = Field(gt=0)  # bytes per second
    interface: str = ""  # e.g. "eth0 (ethernet, 1000 Mbit/s)", when the agents report it
    measured: bool = True  # False: no probe yet, assumed

    def transfer_ms(self, nbytes: int) -> float:
        """One-way time of a message: half the round trip plus serialization."""
        return self.rtt_ms / 2 + nbytes * 1000 / self.bandwidth_Bps

    @property
    def label(self) -> str:
        """'0.30 ms, 0.94 Gbit/s'."""
        return f"{self.rtt_ms:.2f} ms, {self.bandwidth_Bps * 8 / 1e9:.2f} Gbit/s"


# Same host, no link: what a boundary between co-located stages costs.
LOCAL_LINK = LinkCost(rtt_ms=0.07, bandwidth_Bps=2e9, interface="loopback")
# What an unmeasured pair is assumed to be (a gigabit LAN), marked measured=False.
ASSUMED_LINK = LinkCost(rtt_ms=0.3, bandwidth_Bps=117e6, interface="not measured (assumed 1 GbE)", measured=False)
