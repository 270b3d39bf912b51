"""One selection on the Distributed page (webapp/views/selection.py, pure): which cards belong to the
form's choice, what a Hub repo that disagrees says, and why Launch waits — a decide table."""

from __future__ import annotations

import pytest

from orchestrator.control.rules.state import NodePreparation, Preparation, State
from tests.support.builders import node
from tests.support.view_states import plan
from webapp.views.selection import (
    Selection,
    hub_conflict,
    launch_blocker,
    plan_label,
    plan_matches,
    preparation_label,
    preparation_matches,
)

NODES = (node("node-a", models=["smol", "tiny"]), node("node-b"), node("node-c"))


def prepared(model: str = "smol", nodes: tuple[str, ...] = ("n0", "n1"), finished: bool = True,
             status: str = "present") -> Preparation:
    return Preparation(model_id=model, finished=finished,
                       nodes=tuple(NodePreparation(node_id=n, status=status) for n in nodes))


def state(prep: Preparation | None = None, shown: str | None = "plan") -> State:
    return State(nodes=NODES, preparation=prep, plan=plan(shown) if shown else None)


SMOL_AB = Selection("smol", ("n0", "n1"), 2048)


def test_a_plan_belongs_to_its_model_nodes_in_any_order_and_context():
    shown = plan()
    assert plan_matches(shown, SMOL_AB) and plan_matches(shown, Selection("smol", ("n1", "n0"), 2048))
    for other in (Selection("tiny", ("n0", "n1"), 2048), Selection("smol", ("n0", "n2"), 2048),
                  Selection("smol", ("n0", "n1", "n2"), 2048), Selection("smol", ("n0", "n1"), 4096)):
        assert not plan_matches(shown, other), other
    assert plan_label(state(), shown) == "for smol on node-a, node-b at 2048 tokens"


def test_a_preparation_covers_the_chosen_nodes_of_its_model():
    prep = prepared(nodes=("n0", "n1", "n2"))
    assert preparation_matches(prep, SMOL_AB) and not preparation_matches(prep, Selection("tiny", ("n0", "n1")))
    assert not preparation_matches(prepared(), Selection("smol", ("n0", "n2")))
    assert not preparation_matches(prep, Selection("smol", ()))
    assert preparation_label(state(), prepared()) == "for smol on node-a, node-b"


def test_a_hub_repo_of_another_model_is_named_with_the_way_out():
    assert hub_conflict(SMOL_AB) is None
    assert hub_conflict(Selection("smol", ("n0",), hub_repo="org/smol", hub_model_id="smol")) is None
    why = hub_conflict(Selection("smol", ("n0", "n1"), hub_repo="org/Other-4bit", hub_model_id="Other-4bit"))
    assert why == ("Hub repo org/Other-4bit is the model Other-4bit, not the selected smol: choose Other-4bit as "
                   "the model, or clear the Hub repo")


@pytest.mark.parametrize("st, chosen, expected", [
    (state(prepared()), Selection(None, ("n0", "n1")), "choose a model"),
    (state(prepared()), Selection("smol", ("n0",)), "choose at least 2 nodes"),
    (state(prepared()), Selection("smol", ("n0", "n1"), 2048, "org/Other", "Other"), "Hub repo org/Other is"),
    (state(None), SMOL_AB, "Prepare on all nodes first"),
    (state(prepared("tiny")), SMOL_AB, "the preparation shown is for tiny on node-a, node-b, not this selection"),
    (state(prepared(nodes=("n0", "n1", "n2"))).model_copy(update={"preparation": prepared()}),
     SMOL_AB, None),
    (state(prepared(finished=False, status="downloading")), SMOL_AB, "preparation is still running"),
    (state(prepared(status="mismatch")), SMOL_AB, "preparation did not finish with every node's copy Present"),
    (state(prepared(), "refusal"), SMOL_AB, "the shard plan is refused: stage 1 needs"),
    # an enabled Launch must not refuse: the plan of this very selection comes first
    (state(prepared(), None), SMOL_AB, "Preview shard plan of smol on node-a, node-b at 2048 tokens first"),
    (state(prepared(), "refusal"), Selection("smol", ("n0", "n1"), 4096),
     "Preview shard plan of smol on node-a, node-b at 4096 tokens first (the plan shown is for smol on node-a, "
     "node-b at 2048 tokens)"),
    (state(prepared(nodes=("n0", "n1", "n2"))), Selection("smol", ("n1", "n0"), 2048), None),
    (state(prepared()), SMOL_AB, None),
])
def test_why_launch_waits(st, chosen, expected):
    why = launch_blocker(st, chosen)
    assert (why is None) if expected is None else (why is not None and why.startswith(expected)), why


def test_a_running_cluster_of_the_model_on_a_chosen_node_blocks_launch():
    from tests.support.view_states import cluster

    st = state(prepared()).model_copy(update={"sessions": (cluster(),)})
    assert launch_blocker(st, SMOL_AB).startswith("node-a and node-b already serve smol")
