"""What the planner answers: a Plan (per-stage memory, ports, warnings) or a Refusal (reasons)."""

from __future__ import annotations

from enum import StrEnum
from typing import Literal

from pydantic import BaseModel, ConfigDict

from orchestrator.planner.plan_settings import PlanSettings
from orchestrator.planner.predict import Performance
from orchestrator.planner.transport import TransportPlan


class RefusalCode(StrEnum):
    """Why a plan cannot be made; each reason names the node or the model."""

    TOO_FEW_NODES = "too_few_nodes"
    DUPLICATE_NODE = "duplicate_node"
    NOT_MLX_FORMAT = "not_mlx_format"
    UNSUPPORTED_MODEL = "unsupported_model"  # the engine cannot serve it exactly (families/support.py)
    MIXED_ACCELERATORS = "mixed_accelerators"
    MIXED_ENGINE_VERSIONS = "mixed_engine_versions"
    MIXED_BACKENDS = "mixed_backends"  # mlx's metal / cuda / cpu backend, or its wheel, differ
    TOO_MANY_NODES = "too_many_nodes"  # more nodes than layers: a stage would be empty
    INVALID_SPLIT = "invalid_split"
    MODEL_TOO_LARGE = "model_too_large"  # not even the sum of all free memory suffices
    STAGE_DOES_NOT_FIT = "stage_does_not_fit"  # enough in total, but no split fits every node
    NOT_ENOUGH_PORTS = "not_enough_ports"
    NO_THUNDERBOLT = "no_thunderbolt_interface"  # transport thunderbolt, a node without such an interface


class WarningCode(StrEnum):
    """What a plan allows but the user should know before launching."""

    MANY_STAGES = "many_stages"  # more than 2 stages: best validated on 2
    FITS_ON_ONE_NODE = "fits_on_one_node"  # a pipeline gives capacity, not speed
    IMBALANCED = "imbalanced"
    TIGHT_FIT = "tight_fit"


class Issue(BaseModel):
    """One refusal reason or warning: a stable code, a sentence for people, and who it concerns."""

    model_config = ConfigDict(frozen=True)

    code: RefusalCode | WarningCode
    message: str
    node_id: str | None = None  # the node it is about, when it is about one
    missing_bytes: int | None = None  # memory refusals: how much more free memory is needed


class StagePlan(BaseModel):
    """One stage on one node: its layers and the memory-fit bar's numbers."""

    model_config = ConfigDict(frozen=True)

    stage: int
    node_id: str
    node_name: str
    host: str | None = None
    first_layer: int  # inclusive
    last_layer: int  # inclusive
    holds_embedding: bool  # the first stage, and the last one when embeddings are tied
    holds_head: bool  # the last stage: final norm and head
    runs_coordinator: bool
    weight_bytes: int
    kv_cache_bytes: int
    overhead_bytes: int  # the stage process, plus the coordinator process on its node
    total_bytes: int
    free_bytes: int
    memory_kind: str = "host"  # which quantity free_bytes is (NodeFacts.memory_kind)
    fit_fraction: float  # total / free; above 1.0 it does not fit
    token_bytes: int  # weight bytes read per generated token (what the balance evens out)
    prompt_cache_bytes: int = 0  # the prompt-cache budget this stage's headroom allows (planner.memory)
    transport_port: int | None = None  # None in a refusal's attempted split

    @property
    def num_layers(self) -> int:
        """How many layers the stage owns."""
        return self.last_layer - self.first_layer + 1

    @property
    def layers(self) -> str:
        """'0-14': the cluster TOML's inclusive range syntax."""
        return f"{self.first_layer}-{self.last_layer}"

    @property
    def fits(self) -> bool:
        """Whether weights, KV cache and overhead fit the node's free memory."""
        return self.total_bytes <= self.free_bytes


class CoordinatorPlan(BaseModel):
    """Where the coordinator runs: always the first selected node (the node of stage 0).

    It needs two ports there: `transport_port` is its identity in the cluster TOML (every
    node of the TOML has its own ip:port), `http_port` is the OpenAI endpoint the router calls.
    """

    model_config = ConfigDict(frozen=True)

    node_id: str
    host: str | None = None
    transport_port: int
    http_port: int


class Plan(BaseModel):
    """A launchable plan. Warnings do not block; the UI shows them before launch."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["plan"] = "plan"
    model: str
    num_layers: int
    manual: bool  # the split came from the settings, not the balancer
    stages: tuple[StagePlan, ...]
    coordinator: CoordinatorPlan
    ports: dict[str, tuple[int, ...]]  # node id -> every port allocated on it
    warnings: tuple[Issue, ...] = ()
    settings: PlanSettings
    # Predicted speed (planner/predict.py) when the nodes have timed the model's layers.
    performance: Performance | None = None
    # Where the stages bind and connect (planner/transport.py): the backend asked for and the
    # one that runs, with the reason when they differ.
    transport: TransportPlan | None = None

    @property
    def split(self) -> tuple[tuple[int, int], ...]:
        """The inclusive (first, last) layer range of every stage."""
        return tuple((s.first_layer, s.last_layer) for s in self.stages)

    @property
    def warning_codes(self) -> tuple[WarningCode, ...]:
        """The codes of the warnings, in order."""
        return tuple(WarningCode(w.code) for w in self.warnings)


class Refusal(BaseModel):
    """No plan; `reasons` say why. `stages` is the closest attempt, when one could be computed,
    so the memory-fit bars can still show what does not fit."""

    model_config = ConfigDict(frozen=True)

    kind: Literal["refusal"] = "refusal"
    model: str
    reasons: tuple[Issue, ...]
    stages: tuple[StagePlan, ...] = ()

    @property
    def codes(self) -> tuple[RefusalCode, ...]:
        """The codes of the reasons, in order."""
        return tuple(RefusalCode(r.code) for r in self.reasons)
