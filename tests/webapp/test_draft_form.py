"""The launch form's draft model (Flask test client, a real orchestrator that never reaches out):
offered among the models on the nodes when speculative decoding is on, counted in the previewed
plan on the coordinator's node, refused in words when it is the served model itself."""

from __future__ import annotations

from tests.support.control_states import BASE, DRAFT, MODEL, draft_info, with_models
from tests.support.html import parse
from tests.webapp.conftest import Web
from tests.webapp.test_forms import post


def _form(web: Web):
    html = web.client("admin").get(f"/cluster/form?model={MODEL}&nodes=n0&nodes=n1").get_data(as_text=True)
    return parse(html).by_id("draft_model")


def _no_measuring(web: Web, monkeypatch) -> None:
    """The nodes are made up: no links or layer timings to measure after a preview (it would fail, late)."""
    preview = web.orch.preview_plan
    monkeypatch.setattr(web.orch, "preview_plan", lambda *args, **kwargs: preview(*args, **kwargs, measure=False))


def test_the_draft_model_is_offered_then_counted_on_the_coordinators_node(still: Web, monkeypatch):
    _no_measuring(still, monkeypatch)
    still.orch._state = with_models(BASE, draft_info())
    select = _form(still)
    assert "disabled" not in select.attrs
    # the served model is never offered as its own draft (issue 38 item 5)
    assert [o.attrs["value"] for o in select.find_all("option")] == ["", DRAFT]
    r = post(still, "/cluster/plan", {"model": MODEL, "nodes": ["n0", "n1"], "context_length": "2048",
                                      "draft_model": DRAFT})
    assert r.status_code == 200
    preview = parse(r.get_data(as_text=True)).by_id("plan-preview")
    (head,) = [s for s in preview.find_all("div") if s.attrs.get("class") == "stage-head"
               and "runs the coordinator" in s.text]
    assert f"and the draft model {DRAFT} (" in head.text and "with its KV cache" in head.text
    assert still.orch.state.plan.result.settings.draft_model == DRAFT


def test_the_served_model_as_its_own_draft_is_refused_and_changes_nothing(still: Web, monkeypatch):
    _no_measuring(still, monkeypatch)
    still.orch._state = with_models(BASE, draft_info())
    version = still.orch.state.version
    r = post(still, "/cluster/plan", {"model": MODEL, "nodes": ["n0", "n1"], "draft_model": MODEL})
    assert r.status_code == 400
    assert "Draft model: choose a smaller model than the one served" in r.get_data(as_text=True)
    assert still.orch.state.version == version


def test_without_drafts_per_pass_the_choice_is_off_and_says_where_to_turn_it_on(still: Web):
    still.orch._state = with_models(BASE, draft_info(), drafts=0)
    select = _form(still)
    assert "disabled" in select.attrs
    assert "set its tokens drafted per pass under Settings first" in select.parent.text
