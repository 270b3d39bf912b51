"""The control plane's states the decide and model-rule tables start from: two nodes holding
SmolLM2-135M's geometry, a preparation, a running session (pure values, no I/O)."""

from __future__ import annotations

from typing import Any

from orchestrator.agent.schemas import ModelInfo
from orchestrator.control.rules.commands import (
    PreviewPlan,
)
from orchestrator.control.rules.decide import (
    Decision,
    decide,
)
from orchestrator.control.rules.state import (
    Fault,
    NodePreparation,
    Preparation,
    Settings,
    State,
)
from orchestrator.control.rules.transitions import apply
from tests.support.builders import MODEL, model_info, node, session
from tests.support.planner_inputs import llama

# MODEL as each node's report lists it: SmolLM2-135M's geometry
HELD = (model_info(MODEL, description=llama()),)


def prepared(ready: bool = True) -> Preparation:
    return Preparation(model_id=MODEL, finished=ready,
                       nodes=tuple(NodePreparation(node_id=f"n{i}", status="present" if ready else "downloading")
                                   for i in range(2)))


BASE = State(settings=Settings(distributed_enabled=True),
             nodes=(node("node-a", models=HELD), node("node-b", models=HELD)))
PREPARED = BASE.model_copy(update={"preparation": prepared()})
SERVING = PREPARED.model_copy(update={"sessions": (session(),)})
SHOWN = apply(BASE, decide(BASE, PreviewPlan(MODEL, ("n0", "n1"), measure=False)).events[0])
FAULT = Fault(at=1.0, reason="stage-1 gone", processes=("stage-1",), attempts=1)


def with_session(state: State, **kw: Any) -> State:
    """`state` with one session, `session(**kw)`."""
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
