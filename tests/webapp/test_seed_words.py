"""The seed's words on the Distributed page (issue 38 item 5): Preparation classifies each node as
Present / Needs download / Mismatch, a Present copy's verification is its detail line, a check
under way says what it checks, and the form never says "choose a model" beside a model that
looks chosen."""

from __future__ import annotations

from orchestrator.control.rules import events as ev
from orchestrator.control.rules.state import Fault, NodePreparation, Preparation
from orchestrator.planner.predict import Boundary, Performance
from tests.support.builders import session
from tests.support.control_states import BASE, HELD, MODEL, with_models
from tests.support.html import parse
from tests.support.view_states import plan, rich_state
from tests.webapp.conftest import Web
from webapp.touches import CHAT_MODELS, TOUCHES
from webapp.views.cluster import prepare_view
from webapp.views.context import ViewContext
from webapp.views.sessions import fault_rows

CTX = ViewContext(role="viewer")


def test_a_present_copy_is_labelled_present_with_its_verification_as_detail():
    state = rich_state().model_copy(update={"preparation": Preparation(model_id="smol", finished=True, nodes=(
        NodePreparation(node_id="n0", status="present", verdict="present",
                        detail="verified: the reference copy, every file hashed (sha256)"),))})
    [row] = prepare_view(state, CTX)["prep"]["rows"]
    assert row["label"] == "Present" and row["detail"].startswith("verified:")


def test_a_check_under_way_says_what_it_checks_not_a_size_it_does_not_know(still: Web):
    checking = NodePreparation(node_id="n1",
                               detail="comparing its copy with node-a's: 8 files (513 MiB), sha256 of each")
    still.orch._state = BASE.model_copy(update={"preparation": Preparation(model_id=MODEL, nodes=(checking,))})
    html = still.client("admin").get("/models?tab=distributed").get_data(as_text=True)
    row = parse(html).by_id("prepare-status").find("tr", **{"data-node": "node-b"})
    assert "Checking" in row.text and "comparing its copy with node-a's" in row.text and "checking…" in row.text
    assert "size not known yet" not in row.text and "0%" not in row.text


def test_with_no_model_chosen_the_picker_says_so_instead_of_showing_one(still: Web):
    still.orch._state = with_models(BASE, *HELD)
    form = parse(still.client("admin").get("/cluster/form?nodes=n0&nodes=n1").get_data(as_text=True))
    first = form.by_id("model").find_all("option")[0]
    assert first.attrs["value"] == "" and "selected" in first.attrs and first.text == "Choose a model"
    assert "Launch waits: choose a model" in form.text


def test_a_single_node_session_is_never_called_a_cluster():
    stopped = Fault(at=1.0, reason="stage-0 ended", outcome="stopped")
    single = session(splits=((0, 29),), cluster=False, faults=(stopped,))
    assert [r["outcome"] for r in fault_rows(single)] == ["session stopped"]
    assert [r["outcome"] for r in fault_rows(session(faults=(stopped,)))] == ["cluster stopped"]


def test_the_chat_picker_keeps_a_recovering_model_and_knows_when_its_cluster_faulted(still: Web):
    """Issue 38 item 2: after a crash mid-reply the picker said "no model is being served" until a
    reload. The router does not list a recovering cluster's model; the dashboard says it recovers."""
    fault = Fault(at=123.0, reason="stage-1 ended", processes=("stage-1",))
    still.orch._state = BASE.model_copy(update={"sessions": (session(phase="recovering", faults=(fault,)),)})
    body = still.client("admin").get("/chat/models").get_json()
    assert body == {"models": [], "recovering": [MODEL], "faulted": {MODEL: 123.0}}
    # and the Chat page is told to ask again when the cluster faults and when it is back
    assert all(CHAT_MODELS in TOUCHES[e] for e in (ev.SessionFaulted, ev.RecoveryFailed, ev.SessionRecovered))


def test_a_plan_card_gives_a_links_figures_once(still: Web):
    """Issue 38 item 5: the Links matrix and the boundaries table gave different figures for one
    link. The figures are the matrix's alone; the boundaries table says what crosses where."""
    shown = plan()
    perf = Performance(decode_tps_1=10.0, ms_per_token_1=100.0, compute_ms_1=90.0, aggregate_tps=(), ttft_s=(),
                       stage_ms_1=(45.0, 45.0), bottleneck="stage 0", boundaries=(
                           Boundary(source="stage 0", target="stage 1", link="0.30 ms, 0.94 Gbit/s", interface="eth0",
                                    measured=True, ms_per_token=0.5),))
    result = shown.result.model_copy(update={"performance": perf})
    still.orch._state = rich_state().model_copy(update={"plan": shown.model_copy(update={"result": result})})
    html = still.client("admin").get("/models?tab=distributed").get_data(as_text=True)
    table = parse(html).by_id("plan-preview").find("table", **{"aria-label": "stage boundaries"})
    assert "stage 0 → stage 1" in table.text and "eth0" in table.text
    assert "0.94 Gbit/s" not in table.text and "Link" not in table.text
