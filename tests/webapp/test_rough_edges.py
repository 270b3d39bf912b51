"""Issue 12's rough edges, as view-model rules and rendered HTML (parsed, found by id and role):
one unit convention, Healthy only with its facts, Launch disabled while the selected nodes serve
the model (and the running plan kept), Prepare's first display."""

from __future__ import annotations

import pytest

from orchestrator.control.rules.decide import serving_conflict
from orchestrator.control.rules.state import NodePreparation, Preparation, StageStatus
from orchestrator.units import format_bytes
from tests.support.builders import report
from tests.support.html import parse
from tests.support.view_states import MB, cluster, plan, rich_state
from tests.webapp.conftest import Web, csrf_of
from webapp.views.cluster import form_view, monitor_view, prepare_view
from webapp.views.context import ViewContext
from webapp.views.sessions import shown_health

CTX = ViewContext(role="admin")


@pytest.mark.parametrize("n,text", [(0, "0 B"), (1023, "1023 B"), (1536, "1.5 KiB"), (12.5 * MB, "12.5 MiB"),
                                    (513 * MB, "513 MiB"), (1100 * MB, "1.07 GiB"), (-300 * MB, "-300 MiB"),
                                    (3 * 1024**4, "3.00 TiB")])
def test_one_formatting_helper_in_binary_units(n, text):
    assert format_bytes(n) == text


def test_node_toggles_the_node_list_and_the_plan_all_say_gib_and_mib(rich: Web):
    state = rich.orch.state
    budget = report("node-a", 1100 * MB, fingerprint="n0", models=["smol"])  # an agent with --memory-budget 1100M
    rich.orch._state = state.model_copy(update={
        "nodes": (state.nodes[0].model_copy(update={"report": budget}), *state.nodes[1:]), "plan": plan("refusal")})
    page = parse(rich.client("admin").get("/models?tab=distributed").get_data(as_text=True))
    (toggle,) = [label for label in page.by_id("cluster-form").find_all("label")
                 if label.find_all("input", value="n0")]
    assert "1.07 GiB memory free" in toggle.text
    assert "1.07 GiB memory free" in page.by_id("nodes").find("li", data_node="node-a").text
    card = page.by_id("plan-preview")
    assert "needs 800 MiB, 600 MiB free · 200 MiB short" in card.text
    for text in (toggle.text, page.by_id("nodes").text, card.text, page.by_id("prepare-status").text):
        words = text.replace("/", " ").split()
        assert not {"MB", "GB", "KB", "TB"} & set(words), text


def test_healthy_needs_every_stage_seen_alive_and_listening():
    s = cluster()
    assert shown_health(s) == "Healthy"
    unseen = s.model_copy(update={"stage_status": ()})  # the launch is done, the watcher has not looked yet
    assert shown_health(unseen) == "Checking"
    half = s.model_copy(update={"stage_status": (StageStatus(alive=True, port_listening=True), StageStatus())})
    assert shown_health(half) == "Checking"
    assert shown_health(s.model_copy(update={"health": "Unhealthy"})) == "Unhealthy"
    state = rich_state().model_copy(update={"sessions": (unseen,)})
    assert monitor_view(state, CTX)["session"]["health"] == "Checking"


def test_the_badge_and_the_stage_cards_agree(rich: Web):
    s = rich.orch.state.sessions[0].model_copy(update={"stage_status": ()})
    rich.orch._state = rich.orch.state.model_copy(update={"sessions": (s,)})
    page = parse(rich.client("viewer").get("/models?tab=distributed").get_data(as_text=True))
    monitor = page.by_id("cluster-monitor")
    assert monitor.by_id("cluster-health").text == "Checking"
    assert "Process not seen yet" in monitor.text
    sessions = parse(rich.client("viewer").get("/sessions").get_data(as_text=True)).by_id("sessions")
    assert "Healthy" not in sessions.text.split()


def test_launch_is_disabled_with_the_reason_while_the_selected_nodes_serve_the_model(rich: Web):
    state = rich.orch.state  # s1 serves smol on n0 and n1; the plan chose smol on n0 and n1
    reason = "node-a and node-b already serve smol as smol-2stage-s1: stop that cluster first to launch it again"
    assert serving_conflict(state, "smol", ["n0", "n1"]) == reason
    assert serving_conflict(state, "smol", ["n0", "n2"]).startswith("node-a already serves smol")
    assert serving_conflict(state, "other", ["n0", "n1"]) is None
    assert serving_conflict(state.model_copy(update={"sessions": ()}), "smol", ["n0", "n1"]) is None
    prep = Preparation(model_id="smol", finished=True, ready=True,
                       nodes=(NodePreparation(node_id="n0", status="present"),
                              NodePreparation(node_id="n1", status="present")))
    rich.orch._state = state.model_copy(update={"preparation": prep})
    # prepared: only the serving cluster stands in the way
    assert form_view(rich.orch.state, CTX)["choose"](None)["blocked"] == reason
    page = parse(rich.client("admin").get("/models?tab=distributed").get_data(as_text=True))
    (launch,) = page.by_role("button", "Launch cluster")
    assert launch.disabled and launch.attrs["title"] == reason
    assert page.by_id("launch-why").text == "Launch waits: " + reason + "."


def test_pressing_launch_anyway_is_refused_in_words_and_the_running_plan_stays(rich: Web):
    admin = rich.client("admin")
    before = rich.orch.state.plan
    r = admin.post("/cluster/launch", data={"model": "smol", "nodes": ["n0", "n1"], "context_length": "2048"},
                   headers={"X-CSRF-Token": csrf_of(admin), "HX-Request": "true"})
    alert = parse(r.get_data(as_text=True)).by_id("cluster-alert")
    assert r.status_code == 400 and r.headers["HX-Retarget"] == "#cluster-alert"
    assert alert.by_role("alert")[0].text.startswith("Launch cluster: node-a and node-b already serve smol")
    assert "does not fit" not in alert.text
    assert rich.orch.state.plan is before  # nothing was planned: the running cluster's plan stays on screen


def test_prepare_starts_at_zero_percent_while_checking_not_at_100():
    prep = Preparation(model_id="smol", nodes=(NodePreparation(node_id="n0"), NodePreparation(node_id="n1")))
    rows = prepare_view(rich_state().model_copy(update={"preparation": prep}), CTX)["prep"]["rows"]
    # no size while checking: the row's detail says what is checked (issue 38 item 5, test_seed_words)
    assert [(r["label"], r["percent"], r["bytes"]) for r in rows] == [("Checking", 0, "")] * 2


def test_prepare_card_renders_the_first_moment(rich: Web):
    prep = Preparation(model_id="smol", nodes=(NodePreparation(node_id="n0"),))
    rich.orch._state = rich.orch.state.model_copy(update={"preparation": prep})
    page = parse(rich.client("viewer").get("/models?tab=distributed").get_data(as_text=True))
    row = page.by_id("prepare-status").find("tr", data_node="node-a")
    assert "Checking" in row.text and "checking…" in row.text and "100%" not in row.text
    (bar,) = row.by_role("progressbar")
    assert bar.attrs["aria-valuenow"] == "0"
