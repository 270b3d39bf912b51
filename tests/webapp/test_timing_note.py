"""The plan card's pending prediction says where the layers are timed — or that they are not,
beside a serving stage (issue 38 item 4; the choice itself: tests/control/test_plan_beside_serving.py)."""

from __future__ import annotations

import time

from orchestrator.agent.schemas import ProcessInfo
from orchestrator.control.rules.state import State
from orchestrator.control.rules.timing_events import LayerTimingChanged
from orchestrator.control.rules.transitions import apply
from tests.support.builders import MODEL, node, session
from tests.support.control_states import HELD
from webapp.views.plan import measuring_text


def _serving(name: str):
    """A node holding the model whose agent runs stage `name[-1]` of session s1."""
    stage = ProcessInfo(cluster_id="s1", node_id=f"stage-{name[-1]}", kind="stage", model_id=MODEL, pid=1,
                        alive=True, port=39601, port_listening=True, started_at=0, uptime_s=1, lease_remaining_s=50)
    return node(name, models=HELD, processes=[stage])


def test_the_pending_prediction_says_the_layers_are_not_timed_beside_serving():
    state = State(nodes=(_serving("node-a"), _serving("node-b"), node("node-c", models=HELD)), sessions=(session(),))
    assert "not timing smol's layers: node-a, node-b serve a stage now" in measuring_text(state, MODEL, ["n0", "n1"])
    assert f"timing {MODEL}'s layers on node-c" in measuring_text(state, MODEL, ["n0", "n2"])


def test_a_timing_under_way_says_what_on_which_node_and_since_when():
    """Issue 38 item 4: the first prediction took 12.5 minutes behind one static line."""
    started = LayerTimingChanged(node_id="n2", model_id=MODEL, started_at=1_000_000.0)
    state = apply(State(nodes=(node("node-a", models=HELD), node("node-c", node_id="n2", models=HELD))), started)
    since = time.strftime("%H:%M:%S", time.localtime(1_000_000.0))
    assert f"timing {MODEL}'s layers on node-c since {since}" in measuring_text(state, MODEL, ["n0", "n2"])
    ended = apply(state, LayerTimingChanged(node_id="n2", model_id=MODEL))
    assert ended.timing is None and "since" not in measuring_text(ended, MODEL, ["n0", "n2"])
