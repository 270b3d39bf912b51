"""Wire models of the agent's performance facts: network interfaces, measured links, and
timed layers (docs/agent-api.md, "Links and compute")."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

InterfaceKind = Literal["loopback", "ethernet", "wifi", "thunderbolt", "infiniband", "virtual", "other"]


class NetInterface(BaseModel):
    """One network interface as the OS describes it."""

    name: str
    kind: InterfaceKind
    speed_mbps: int | None = None  # what the OS says (/sys/class/net/*/speed); None when it does not
    rdma: bool = False  # an RDMA device sits on it (/sys/class/infiniband/*/device/net)
    addresses: list[str] = []
    up: bool = True


class LinkPeer(BaseModel):
    """A peer to probe: its agent URL and a probe ticket it minted (POST /v1/links/tickets)."""

    model_config = ConfigDict(extra="forbid")

    node_id: str = Field(min_length=1, max_length=128)
    name: str = Field(default="", max_length=128)
    url: str = Field(min_length=1, max_length=256)
    ticket: str = Field(min_length=1, max_length=256, repr=False)
    # the address the peer's stage will be given (planner/transport.py); "" = the url's host
    transport_host: str = Field(default="", max_length=64)


class MeasureLinksRequest(BaseModel):
    """POST /v1/links/measure: probe these peers now (and every `interval_s` from then on)."""

    model_config = ConfigDict(extra="forbid")

    peers: list[LinkPeer] = Field(max_length=32)
    pings: int = Field(default=8, ge=2, le=50)
    payload_bytes: int = Field(default=1 << 20, ge=64 << 10, le=1 << 20)  # bounded by the agent's body limit
    interval_s: float = Field(default=60.0, ge=5.0, le=3600.0)


class LinkSample(BaseModel):
    """This node's last measurement of the link to one peer."""

    node_id: str
    name: str = ""
    url: str
    rtt_ms: float | None = None  # the kernel's TCP round-trip estimate (network only)
    http_rtt_ms: float | None = None  # a small authenticated request, median (what software adds included)
    # a framed round trip on the stage transport's path (agent/linkecho.py), relays included
    path_rtt_ms: float | None = None
    path: str = ""  # "host:port" that path reached (empty: an older peer, measured over HTTP only)
    bandwidth_Bps: float | None = None  # from two payload sizes: fixed costs cancel out
    bandwidth_lower_bound: bool = False  # too fast to measure: the link carries at least bandwidth_Bps
    interface: str = ""  # the local interface the traffic leaves by
    at: float = 0.0  # unix time
    error: str | None = None

    @property
    def plan_rtt_ms(self) -> float | None:
        """The round trip plans and the link matrix take: through the transport's path when
        measured there (a user-space relay's delay included, which the kernel's estimate of the
        first hop misses), else the kernel's estimate, else the HTTP one."""
        for value in (self.path_rtt_ms, self.rtt_ms, self.http_rtt_ms):
            if value is not None:
                return value
        return None


class LinkList(BaseModel):
    links: list[LinkSample]


class ComputeProfile(BaseModel):
    """This node's timing of one model's layers (planner/perf_inputs.LayerTiming's fields)."""

    model_id: str
    batch: int = 8
    layer_ms_b1_solo: float
    layer_ms_b1: float
    layer_ms_bB: float
    head_ms_b1_solo: float = 0.0
    head_ms_b1: float = 0.0
    head_ms_bB: float = 0.0
    layer_ms_rows: tuple[tuple[int, float], ...] = ()  # (rows, ms) between 1 and batch
    head_ms_rows: tuple[tuple[int, float], ...] = ()
    prefill_ms_per_token: float
    prefill_ms_per_token_per_k: float = 0.0
    # per-step cost beyond the layers (engine/profiling/step.py); 0 in profiles from before it
    step_ms_b1: float = 0.0
    step_ms_bB: float = 0.0
    last_step_ms_b1: float = 0.0
    last_step_ms_bB: float = 0.0
    coordinator_ms_b1: float = 0.0
    coordinator_ms_bB: float = 0.0
    threads: tuple[int, int] = (0, 0)  # (base, solo) BLAS threads it ran with; 0 = the library's default
    load: float = 0.0  # the machine's 1-minute load average when the timing started (0: unknown)
    cpus: int = 0  # its CPU count then (0: unknown)
    spread: float = 0.0  # how far the rounds of one timed step disagreed (max / min - 1)
    doubt: str = ""  # the busy-machine rule's (agent/timing_doubt.py) after the last try; "" trusted
    tries: int = 1  # timings taken (again while doubted, agent/compute.py)
    at: float = 0.0
    layers_timed: int = 0  # the body's layers timed, standing for all (families/layer_kinds.py); 0: unknown
    reused_from: str = ""  # timed on this model of the same family, shapes, dtype and backend ("": itself)


class ProfileStatus(BaseModel):
    """GET/POST /v1/models/{id}/profile."""

    model_id: str
    state: Literal["absent", "running", "done", "failed"]
    profile: ComputeProfile | None = None
    error: str | None = None
