"""Serve on this node, over HTTP: the context length and concurrency fields, checked at the field,
and the planner's memory check refusing what does not fit with its numbers; nothing starts then."""

from __future__ import annotations

import pytest

from orchestrator.agent.schemas import ModelInfo
from orchestrator.control.rules.state import State
from tests.support.builders import node
from tests.support.html import parse
from tests.support.planner_inputs import llama
from tests.support.view_states import MB
from tests.webapp.conftest import Web, csrf_of


def described(free: int) -> State:
    """node-a holds SmolLM2-135M's geometry (540 MiB of weights) with `free` bytes of memory."""
    a = node("node-a")
    report = a.report.model_copy(update={
        "models": [ModelInfo(id="smol", mlx_format=True, supported=True, num_layers=30, total_bytes=540 * MB,
                             description=llama())],
        "memory": a.report.memory.model_copy(update={"free_bytes": free})})
    return State(nodes=(a.model_copy(update={"report": report}),))


def serve(web: Web, **fields: str):
    admin = web.client("admin")
    return admin.post("/models/smol/serve", data={"node_id": "n0", **fields},
                      headers={"X-CSRF-Token": csrf_of(admin), "HX-Request": "true"})


@pytest.mark.parametrize("fields, message", [
    ({"context_length": "abc"}, "Serve: Context length: enter a whole number"),
    ({"context_length": "100"}, "Serve: Context length: must be between 256 and 131072"),
    ({"concurrency": "0"}, "Serve: Concurrent requests: must be between 1 and 64"),
])
def test_bad_settings_are_refused_naming_the_field(rich: Web, fields: dict, message: str):
    rich.orch._state = described(8 << 30)
    r = serve(rich, **fields)
    assert r.status_code == 400
    assert parse(r.get_data(as_text=True)).by_role("alert")[0].text == message
    assert rich.orch.state.sessions == ()


def test_a_model_that_does_not_fit_the_node_is_refused_with_the_numbers(rich: Web):
    rich.orch._state = described(1100 * MB)
    r = serve(rich, context_length="8192", concurrency="64")
    (alert,) = parse(r.get_data(as_text=True)).by_role("alert")
    assert r.status_code == 400 and alert.text.startswith("Serve: model smol needs ")
    assert "KV cache" in alert.text and "for 64 x 8192 tokens" in alert.text and "on node node-a" in alert.text
    assert rich.orch.state.sessions == ()
    # the same model at a context and concurrency that fit starts, bounded to them (its Configuration)
    r = serve(rich, context_length="1024", concurrency="2")
    assert r.status_code == 200, r.get_data(as_text=True)
    (session,) = rich.orch.state.sessions
    assert "context_length = 1024" in session.config_toml and "max_requests = 2" in session.config_toml


def test_the_local_page_offers_the_settings_every_serve_button_sends(rich: Web):
    rich.orch._state = described(8 << 30)
    page = parse(rich.client("admin").get("/models?tab=local").get_data(as_text=True))
    assert page.by_id("serve-context").attrs["value"] == "4096"
    assert page.by_id("serve-concurrency").attrs["value"] == "4"
    assert len(page.by_role("button", "Serve on this node")) == 1
    form = next(e for e in page.by_id("local-models").find_all("form") if "serve" in e.attrs.get("hx-post", ""))
    assert form.attrs["hx-include"] == "#serve-settings-form" and page.by_id("serve-settings-form")
