"""One selection on the Distributed page, over HTTP: the form answers for the user's own choice
(GET /cluster/form with its input), the cards say which selection they are of, and Prepare
refuses a Hub repo of another model than the selected one, changing nothing."""

from __future__ import annotations

from orchestrator.control.rules.state import NodePreparation, Preparation
from tests.support.html import parse
from tests.webapp.conftest import Web, csrf_of


def test_the_cards_say_which_selection_they_are_of(rich: Web):
    page = parse(rich.client("admin").get("/models?tab=distributed").get_data(as_text=True))
    plan, prep = page.by_id("plan-preview"), page.by_id("prepare-status")
    assert (plan.attrs["data-model"], plan.attrs["data-nodes"], plan.attrs["data-context"]) == ("smol", "n0,n1", "2048")
    assert (prep.attrs["data-model"], prep.attrs["data-nodes"]) == ("smol", "n0,n1")
    assert "this plan is for smol on node-a, node-b at 2048 tokens, not the selection above" in plan.text
    assert "this preparation is for smol on node-a, node-b, not the selection above" in prep.text


def test_the_form_answers_with_launch_disabled_for_another_selection(rich: Web):
    st = rich.orch.state
    prep = Preparation(model_id="smol", finished=True,
                       nodes=(NodePreparation(node_id="n0", status="present"),
                              NodePreparation(node_id="n1", status="present")))
    rich.orch._state = st.model_copy(update={"sessions": (), "preparation": prep})
    admin = rich.client("admin")
    same = parse(admin.get("/cluster/form?model=smol&nodes=n0&nodes=n1&context_length=2048").get_data(as_text=True))
    (launch,) = same.by_role("button", "Launch cluster")
    assert not launch.disabled
    other = parse(admin.get("/cluster/form?model=smol&nodes=n0&nodes=n2&context_length=2048").get_data(as_text=True))
    (launch,) = other.by_role("button", "Launch cluster")
    assert launch.disabled and launch.attrs["title"].startswith("Preview shard plan of smol on node-a, node-c at 2048")
    assert other.by_id("launch-why").text.startswith("Launch waits: Preview shard plan of smol on node-a, node-c")


def test_prepare_refuses_a_hub_repo_of_another_model_and_changes_nothing(rich: Web):
    admin = rich.client("admin")
    before = rich.orch.state
    r = admin.post("/cluster/prepare", data={"model": "smol", "nodes": ["n0", "n1"], "hub_repo": "org/Other-4bit",
                                             "changed": "model"},
                   headers={"X-CSRF-Token": csrf_of(admin), "HX-Request": "true"})
    alert = parse(r.get_data(as_text=True)).by_id("cluster-alert")
    assert r.status_code == 400
    assert alert.by_role("alert")[0].text.startswith(
        "Prepare on all nodes: Hub repo org/Other-4bit is the model Other-4bit, not the selected smol")
    assert rich.orch.state.preparation is before.preparation
