"""The control plane's state: immutable pydantic models, replaced (never mutated) on change."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from orchestrator.agent.schemas import Report
from orchestrator.control.rules.download_state import ModelDeletion, ModelDownload
from orchestrator.planner import Plan, Refusal


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True)


class Settings(_Frozen):
    """Settings → Advanced → Distributed serving."""

    distributed_enabled: bool = False
    transport_backend: Literal["tcp", "thunderbolt", "rdma"] = "tcp"
    port_start: int = Field(default=39600, ge=1024, le=65535)
    port_end: int = Field(default=39629, ge=1024, le=65535)
    # A stage (or the coordinator) that dies or wedges is replaced alone, the others keep
    # their weights; after this many failed attempts in a row the session is torn down.
    auto_restart: bool = True
    restart_attempts: int = Field(default=3, ge=1, le=10)
    # Speculative decoding by prompt lookup (docs/speculation.md): the most tokens a request drafts
    # per pass through the stages; 0 = off, the default (docs/benchmark.md measured no gain here yet).
    speculative_tokens: int = Field(default=0, ge=0, le=16)


class Node(_Frozen):
    """A registered node (its agent)."""

    id: str  # the agent's fingerprint
    name: str
    url: str  # the agent's root, http://host:port
    credential: str = Field(repr=False)  # from pairing; persisted 0600, never shown
    status: Literal["reachable", "unreachable"] = "reachable"
    error: str | None = None
    last_seen: float | None = None
    report: Report | None = None

    @property
    def host(self) -> str:
        """The agent's host (engine processes bind on the same address)."""
        return self.url.split("://", 1)[1].rsplit(":", 1)[0]


class DiscoveredNode(_Frozen):
    """An agent seen through zeroconf: a hint, registration still needs its pairing token."""

    fingerprint: str
    name: str
    url: str
    accelerator: str = ""
    models: tuple[str, ...] = ()


StepState = Literal["pending", "running", "done", "failed", "rolled_back", "skipped"]


class Step(_Frozen):
    """One line of a launch timeline."""

    key: str
    label: str
    state: StepState = "pending"
    detail: str = ""


class StagePlacement(_Frozen):
    """Where a stage runs."""

    index: int
    node_id: str
    node_name: str
    first_layer: int
    last_layer: int
    host: str
    port: int


class StageProgress(_Frozen):
    """A stage's own progress report (its PONG, relayed by the coordinator's /health)."""

    steps: int = 0  # steps completed since the process started
    busy_s: float = 0.0  # time in the current step (0: idle)
    request: int | None = None  # the request of the current step
    chunk: tuple[int, int] | None = None  # its (KV position, tokens)
    queued: int = 0  # work waiting for the compute thread
    pid: int | None = None


class StageCache(_Frozen):
    """A stage's prompt-cache entries as its last PONG said (docs/prompt-cache.md)."""

    entries: int = 0
    bytes: int = 0
    hits: int = 0
    tokens_reused: int = 0


class Speculation(_Frozen):
    """Speculative decoding as the coordinator counted it (shown on the verifying, last stage's card)."""

    max_drafts: int = 0
    passes: int = 0
    drafted: int = 0
    accepted: int = 0
    refused: bool = False  # a stage cannot verify drafts exactly: it never drafts
    refusal: str | None = None  # why (the stage's words)


class StageStatus(_Frozen):
    """What the watcher last saw of a stage."""

    alive: bool | None = None
    port_listening: bool | None = None
    step_ms: float | None = None
    connected: bool | None = None
    detail: str = ""
    progress: StageProgress | None = None
    fault: str = ""  # the coordinator's verdict, e.g. "wedged: no progress for 16 s inside one step"
    prompt_cache: StageCache | None = None
    speculation: Speculation | None = None  # the last stage's, when the cluster speculates


class PostMortem(_Frozen):
    """What was left of a faulted process: how it ended, its last output and progress."""

    process: str  # "stage-1" or "coordinator"
    node_name: str
    ended: str  # "SIGKILL", "exit status 1", "still running (wedged): killed", "agent unreachable"
    log_tail: tuple[str, ...] = ()
    progress: StageProgress | None = None


FaultOutcome = Literal["recovering", "recovered", "stopped"]


class ResumedRequests(_Frozen):
    """What became of the answers the coordinator held while a fault's process was replaced (its pause,
    engine/coordinator/pauses.py): how many it held, resumed and lost, and how long it took."""

    pause: str  # the coordinator's id of the pause: never reported for two faults
    held: int
    resumed: int
    lost: int
    seconds: float | None = None  # the stage's loss -> every held answer went on or ended
    ready_s: float | None = None  # the stage's loss -> the pipeline ready again (the resume began)


class Fault(_Frozen):
    """One fault of a session and what became of it (kept in the session, shown in its drawer)."""

    at: float  # wall-clock time it was seen
    reason: str
    processes: tuple[str, ...] = ()  # what was replaced ("" when nothing could be: torn down)
    outcome: FaultOutcome = "recovering"
    attempts: int = 0
    recovery_s: float | None = None  # seen -> Healthy again
    post_mortems: tuple[PostMortem, ...] = ()
    relaunch: bool = False  # the whole session started again in launch order (found gone after a restart)
    resumed: ResumedRequests | None = None  # the answers in flight it paused (None: none, or not known yet)


class Sample(_Frozen):
    """One look at a running session, for the live charts: throughput and per-stage step latency."""

    at: float  # wall-clock seconds (time.time()) of the observation
    tokens_per_s: float | None = None  # generated tokens/s since the previous look; None when unknown
    step_ms: tuple[float | None, ...] = ()  # per stage, in stage order


SAMPLES = 60  # samples kept per session: about 30 s at the watcher's two looks a second

Health = Literal["Starting", "Healthy", "Unhealthy", "Stopped"]
Phase = Literal["launching", "running", "recovering", "stopping", "stopped", "failed"]


class Session(_Frozen):
    """A serving session: a cluster (several stages) or a single-node session (one stage)."""

    id: str
    name: str  # the router backend name
    model_id: str
    model_name: str  # what /v1/models lists
    cluster: bool
    stages: tuple[StagePlacement, ...]
    coordinator_node: str
    coordinator_host: str
    coordinator_port: int
    phase: Phase = "launching"
    health: Health = "Starting"
    reason: str = ""
    timeline: tuple[Step, ...] = ()
    stage_status: tuple[StageStatus, ...] = ()
    samples: tuple[Sample, ...] = ()  # the last SAMPLES changed looks, oldest first (not persisted)
    registered: bool = False
    created_at: float = 0.0
    transport_fallback: str = ""  # why the requested backend does not run, e.g. "rdma requested, running on tcp: …"
    transport: str = ""  # the plan's transport in one line (planner/transport.py); the timeline's first step
    config_toml: str = ""  # the cluster TOML from the plan (no secret in it); built from stages if empty
    faults: tuple[Fault, ...] = ()  # the last FAULTS, oldest first
    recovery_attempt: int = 0  # attempts made for the current fault (0 when none is being recovered)

    @property
    def url(self) -> str:
        """The coordinator's OpenAI root."""
        return f"http://{self.coordinator_host}:{self.coordinator_port}"

    @property
    def node_ids(self) -> tuple[str, ...]:
        """Every node the session runs on (stages and coordinator)."""
        ids = [s.node_id for s in self.stages]
        if self.coordinator_node not in ids:
            ids.append(self.coordinator_node)
        return tuple(dict.fromkeys(ids))


PrepareStatus = Literal["checking", "present", "needs_download", "mismatch", "downloading", "failed"]


class NodePreparation(_Frozen):
    """One node's side of preparing a model."""

    node_id: str
    status: PrepareStatus = "checking"
    # The node's classification before any copy (present / needs_download / mismatch), kept
    # while it downloads so the dashboard can still say why it is copying.
    verdict: PrepareStatus | None = None
    detail: str = ""
    done_bytes: int = 0
    total_bytes: int = 0
    rate_bps: float = 0.0
    source: str = ""


class Preparation(_Frozen):
    """Getting one model onto the selected nodes."""

    model_id: str
    nodes: tuple[NodePreparation, ...]
    finished: bool = False
    error: str = ""

    @property
    def ready(self) -> bool:
        """Every node Present and verified."""
        return self.finished and all(n.status == "present" for n in self.nodes)


class PreviewedPlan(_Frozen):
    """The last previewed plan, shown to every viewer: what was asked (model, nodes in the
    user's order, context length) and the planner's answer, a launchable `Plan` or a `Refusal`.

    Its JSON (`/api/state`'s `plan`, the `plan_previewed` event) is the planner's own JSON with
    `model_id`, `node_ids` and `context_length` beside its fields, as it was before this was
    typed; validation accepts that flat shape too.
    """

    model_id: str
    node_ids: tuple[str, ...]
    context_length: int
    result: Annotated[Plan | Refusal, Field(discriminator="kind")]

    @property
    def refused(self) -> bool:
        """Whether the planner refused (no launchable plan)."""
        return isinstance(self.result, Refusal)

    @model_validator(mode="before")
    @classmethod
    def _from_flat(cls, data: Any) -> Any:
        if isinstance(data, dict) and "result" not in data:
            asked = {k: data[k] for k in ("model_id", "node_ids", "context_length") if k in data}
            return {**asked, "result": {k: v for k, v in data.items() if k not in asked}}
        return data

    @model_serializer(mode="wrap")
    def _to_flat(self, handler: Any) -> dict[str, Any]:
        doc = handler(self)
        return {"model_id": doc["model_id"], "node_ids": doc["node_ids"], "context_length": doc["context_length"],
                **doc["result"]}


class VerifiedCopy(_Frozen):
    """A node's copy of a model the dashboard checked file by file (sha256) (control/rules/verification.py)."""

    model_id: str
    node_id: str
    fingerprint: str = ""  # of the node's reported manifest when checked; "" until the node reports it
    how: str = ""  # what checked it: "downloaded from the hub", "checked against node-a", "Verify"


class CopyCheck(_Frozen):
    """The latest Verify of one copy: running, or how it ended."""

    model_id: str
    node_id: str
    phase: Literal["running", "verified", "failed"] = "running"
    message: str = ""


class TimingRun(_Frozen):
    """A node timing a model's layers for a plan's prediction (control/perf.py), since when."""

    node_id: str
    model_id: str
    started_at: float  # wall-clock seconds


class State(_Frozen):
    """Everything the dashboard shows, as one immutable snapshot."""

    settings: Settings = Settings()
    nodes: tuple[Node, ...] = ()
    discovered: tuple[DiscoveredNode, ...] = ()
    sessions: tuple[Session, ...] = ()  # live: launching, running or stopping
    history: tuple[Session, ...] = ()  # recently ended (newest last), for the monitor's final word
    preparation: Preparation | None = None
    downloads: tuple[ModelDownload, ...] = ()  # Models tab: hub downloads and their LAN copies
    deletions: tuple[ModelDeletion, ...] = ()  # Models tab: models being (or just) deleted from a node
    plan: PreviewedPlan | None = None  # the last previewed plan, shown to every viewer
    verified: tuple[VerifiedCopy, ...] = ()  # copies the dashboard checked, while their files stay
    checks: tuple[CopyCheck, ...] = ()  # Verify on request: the latest per copy
    timing: TimingRun | None = None  # the layer timing under way (not saved: control/rules/timing_events.py)
    version: int = 0

    def node(self, node_id: str) -> Node | None:
        """The registered node with this id."""
        return next((n for n in self.nodes if n.id == node_id), None)

    def session(self, session_id: str) -> Session | None:
        """The live or recently ended session with this id."""
        return next((s for s in self.sessions + self.history if s.id == session_id), None)
