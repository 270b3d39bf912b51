"""Actions' answers: validation messages next to the control, the user's input kept, nothing changed."""

from __future__ import annotations

import pytest

from tests.support.html import parse
from tests.webapp.conftest import Web, csrf_of

GOOD = {"distributed_enabled": "on", "transport_backend": "tcp", "port_start": "39600", "port_end": "39629"}


def post(web: Web, path: str, data: dict, **headers: str):
    admin = web.client("admin")
    return admin.post(path, data=data, headers={"X-CSRF-Token": csrf_of(admin), "HX-Request": "true", **headers})


@pytest.mark.parametrize("change,message", [
    ({"port_start": "39700", "port_end": "39600"}, "Transport port range: the start must not exceed the end"),
    ({"port_start": "abc"}, "Transport port range start: enter a whole number"),
    ({"port_end": "70000"}, "Transport port range end: must be between 1024 and 65535"),
    ({"port_start": "80"}, "Transport port range start: must be between 1024 and 65535"),
    ({"port_start": "39600", "port_end": "39602"}, "Transport port range: needs at least 4 ports for 2 stages"),
    ({"transport_backend": "carrier-pigeon"}, "Default transport backend: unknown value 'carrier-pigeon'"),
    ({"speculative_tokens": "17"}, "Speculative decoding: must be between 0 and 16"),
    ({"speculative_tokens": "four"}, "Speculative decoding: enter a whole number"),
])
def test_settings_validation_says_what_is_wrong_keeps_the_input_and_saves_nothing(web: Web, change: dict,
                                                                                   message: str):
    version = web.orch.state.version
    r = post(web, "/settings/distributed", {**GOOD, **change})
    form = parse(r.get_data(as_text=True)).by_id("settings-form")
    assert r.status_code == 400
    (alert,) = form.by_role("alert")
    assert alert.text == message
    for name, value in change.items():  # the user's input is kept to correct it
        if name != "transport_backend":
            assert form.find("input", name=name).attrs["value"] == value
    assert web.orch.state.version == version and not web.orch.state.settings.distributed_enabled


def test_valid_settings_are_saved_and_confirmed(web: Web):
    r = post(web, "/settings/distributed", {**GOOD, "transport_backend": "rdma", "port_start": "40000",
                                              "port_end": "40009"})
    assert r.status_code == 200
    assert "Saved: distributed serving on, rdma, ports 40000–40009." in r.get_data(as_text=True)
    s = web.orch.state.settings
    assert s.distributed_enabled and s.transport_backend == "rdma" and (s.port_start, s.port_end) == (40000, 40009)
    assert s.speculative_tokens == 0 and "Speculative decoding is off." in r.get_data(as_text=True)
    r = post(web, "/settings/distributed", {**GOOD, "speculative_tokens": "4"})
    assert r.status_code == 200 and web.orch.state.settings.speculative_tokens == 4
    assert "Speculative decoding drafts up to 4 tokens per pass" in r.get_data(as_text=True)
    form = parse(r.get_data(as_text=True)).by_id("settings-form")
    assert form.find("input", name="speculative_tokens").attrs["value"] == "4"


@pytest.mark.parametrize("path", ["/cluster/plan", "/cluster/prepare", "/cluster/launch"])
def test_cluster_actions_refused_show_the_message_under_the_buttons_with_the_selection_kept(web: Web, path: str):
    version = web.orch.state.version
    r = post(web, path, {"model": "smol", "nodes": ["only-one"], "context_length": "2048"})
    answer = parse(r.get_data(as_text=True))
    assert r.status_code == 400 and r.headers["HX-Retarget"] == "#cluster-alert"
    (alert,) = answer.by_id("cluster-alert").by_role("alert")
    assert alert.text.endswith("Select at least 2 nodes")
    assert not answer.find_all(id="cluster-selection")  # only the message is swapped: the user's input stays
    assert web.orch.state.version == version


def test_an_accepted_cluster_action_clears_the_last_refusal(rich: Web, monkeypatch: pytest.MonkeyPatch):
    # the web layer's answer only: the orchestrator (tested in tests/control) accepts at once
    monkeypatch.setattr(rich.orch, "prepare", lambda *args, **kwargs: None)
    r = post(rich, "/cluster/prepare", {"model": "smol", "nodes": ["n0", "n1"]})
    cleared = parse(r.get_data(as_text=True)).by_id("cluster-alert")
    assert r.status_code == 200 and cleared.attrs.get("hx-swap-oob") == "true" and not cleared.by_role("alert")


def test_bad_context_length_and_unknown_nodes_are_explained(web: Web):
    r = post(web, "/cluster/plan", {"model": "smol", "nodes": ["a", "b"], "context_length": "12"})
    assert r.status_code == 400 and "Context length: must be between 256 and 131072" in r.get_data(as_text=True)
    r = post(web, "/cluster/prepare", {"model": "smol", "nodes": ["a", "b"]})
    assert r.status_code == 400 and "unknown nodes: a, b" in r.get_data(as_text=True)
    r = post(web, "/cluster/launch", {"model": "smol", "nodes": ["a", "b"]})
    assert r.status_code == 400 and "prepare the model on every selected node first" in r.get_data(as_text=True)


def test_add_node_refusals_keep_the_address_next_to_the_form(web: Web):
    r = post(web, "/nodes", {"address": "10.1.2.3:39500", "token": ""})
    form = parse(r.get_data(as_text=True)).by_id("add-node")
    assert r.status_code == 400
    assert form.by_role("alert")[0].text == "Add node: both the address and the pairing token are needed"
    assert form.by_id("node-address").attrs["value"] == "10.1.2.3:39500"
    r = post(web, "/nodes", {"address": "no-port-here", "token": "t"})
    assert r.status_code == 400 and "expected host:port of a node agent" in r.get_data(as_text=True)
    assert web.orch.state.nodes == ()


def test_stopping_an_unknown_session_is_409_and_removing_an_unknown_node_too(web: Web):
    r = post(web, "/sessions/nope/stop", {})
    assert r.status_code == 409 and "no live session 'nope'" in r.get_data(as_text=True).replace("&#39;", "'")
    r = post(web, "/nodes/nope/remove", {})
    assert r.status_code == 409


def test_an_unreachable_agent_is_explained_in_words(web: Web):
    r = post(web, "/nodes", {"address": "127.0.0.1:1", "token": "t"})
    html = r.get_data(as_text=True)
    assert r.status_code == 400 and "connection refused (is `pipeserve agent` running on that port?)" in html
    assert "HTTPConnectionPool" not in html
