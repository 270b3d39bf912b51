"""The control plane's states the decide and model-rule tables start from: two nodes holding
SmolLM2-135M's geometry, a preparation, a running session (pure values, no I/O)."""

from __future__ import annotations

from typing import Any

from orchestrator.agent.schemas import Accelerator, Memory, ModelInfo, Ports, Report
from orchestrator.control.commands import (
    PreviewPlan,
)
from orchestrator.control.decide import (
    Decision,
    decide,
)
from orchestrator.control.state import (
    Fault,
    Node,
    NodePreparation,
    Preparation,
    Session,
    Settings,
    StagePlacement,
    State,
)
from orchestrator.control.transitions import apply
from tests.planner.support import llama

GIB = 1 << 30
MODEL = "smol"


def report(name: str, free: int) -> Report:
    """A node's report holding MODEL (SmolLM2-135M's geometry) with `free` bytes of memory."""
    return Report(name=name, fingerprint=f"fp-{name}", version="0.1.0",
                  accelerator=Accelerator(family="linux-cpu", detail="x86_64"), versions={"mlx": "0.32.4"},
                  platform={"system": "Linux"},
                  memory=Memory(total_bytes=free, available_bytes=free, budget_bytes=free, processes_rss_bytes=0,
                                free_bytes=free),
                  disk_free_bytes=10**11, transport_ports=Ports(start=39600, end=39629, free=list(range(39600, 39630))),
                  models=[ModelInfo(id=MODEL, mlx_format=True, supported=True, num_layers=30, total_bytes=540 << 20,
                                    description=llama())],
                  processes=[], downloads=[])


def node(i: int, free: int = 8 * GIB) -> Node:
    return Node(id=f"n{i}", name=f"node-{'ab'[i]}", url=f"http://10.0.0.{i + 1}:39500", credential="c",
                report=report(f"node-{'ab'[i]}", free))


def session(sid: str = "s1", phase: str = "running", name: str = "smol-2stage", **kw) -> Session:
    stages = tuple(StagePlacement(index=i, node_id=f"n{i}", node_name=f"node-{'ab'[i]}", first_layer=15 * i,
                                  last_layer=15 * i + 14, host=f"10.0.0.{i + 1}", port=39601) for i in range(2))
    return Session(id=sid, name=name, model_id=MODEL, model_name=MODEL, cluster=True, stages=stages,
                   coordinator_node="n0", coordinator_host="10.0.0.1", coordinator_port=39610, phase=phase, **kw)


def prepared(ready: bool = True) -> Preparation:
    return Preparation(model_id=MODEL, finished=ready,
                       nodes=tuple(NodePreparation(node_id=f"n{i}", status="present" if ready else "downloading")
                                   for i in range(2)))


BASE = State(settings=Settings(distributed_enabled=True), nodes=(node(0), node(1)))
PREPARED = BASE.model_copy(update={"preparation": prepared()})
SERVING = PREPARED.model_copy(update={"sessions": (session(),)})
SHOWN = apply(BASE, decide(BASE, PreviewPlan(MODEL, ("n0", "n1"), measure=False)).events[0])
FAULT = Fault(at=1.0, reason="stage-1 gone", processes=("stage-1",), attempts=1)


def with_session(state: State, **kw) -> State:
    return state.model_copy(update={"sessions": (session(**kw),)})


def kinds(decision: Decision) -> list[str]:
    return [e.kind for e in decision.events]


def effect_types(decision: Decision) -> list[str]:
    return [type(e).__name__ for e in decision.effects]


# A draft model for speculative decoding beside MODEL (tests/control/test_draft_choice.py)
DRAFT = "smol-draft"
SMALL = llama(layers=4, name=DRAFT)


def with_models(state: State, *models: ModelInfo, on: tuple[int, ...] = (0, 1), drafts: int = 4) -> State:
    """`state` with `models` on nodes `on` as well, and speculative decoding at `drafts` tokens per pass."""
    nodes = tuple(n.model_copy(update={"report": n.report.model_copy(update={"models": [*n.report.models, *models]})})
                  if i in on else n for i, n in enumerate(state.nodes))
    return state.model_copy(update={"nodes": nodes, "settings": state.settings.model_copy(
        update={"speculative_tokens": drafts})})


def draft_info(description: Any = SMALL, model_id: str = DRAFT) -> ModelInfo:
    """A node's report of a small draft model (SmolLM2's tokenizer, 4 layers)."""
    return ModelInfo(id=model_id, mlx_format=True, supported=True, num_layers=description.num_layers,
                     total_bytes=description.total_bytes, description=description)
