"""Every page renders for admins and viewers; viewers get no way to act."""

from __future__ import annotations

import pytest

from tests.support.html import parse
from tests.webapp.conftest import Web, buttons
from webapp.components import COMPONENTS

PAGES = ["/models?tab=distributed", "/models?tab=local", "/sessions", "/chat", "/settings"]
ACTION_LABELS = {"Save", "Add node", "Register", "Preview shard plan", "Prepare on all nodes", "Launch cluster",
                 "Stop cluster", "Stop", "Remove", "Create viewer link", "Send"}


@pytest.mark.parametrize("path", PAGES)
def test_every_page_renders_for_an_admin_with_its_labels(rich: Web, path: str):
    r = rich.client("admin").get(path)
    html = r.get_data(as_text=True)
    assert r.status_code == 200 and "Viewing only." not in html
    for nav in ("Models", "Sessions", "Chat", "Settings"):
        assert f">{nav}</a>" in html


def test_the_distributed_tab_shows_the_whole_flow(rich: Web):
    html = rich.client("admin").get("/models?tab=distributed").get_data(as_text=True)
    page = parse(html)
    for element in ("nodes", "add-node", "cluster-form", "plan-preview", "prepare-status", "cluster-monitor"):
        page.by_id(element)
    for label in ("Add node", "Register", "Model", "Preview shard plan", "Prepare on all nodes", "Launch cluster",
                  "Stop cluster", "Healthy", "Present", "Needs download", "Unsupported: unreachable"):
        assert label in page.text, label
    # only display components are live: forms are never pushed under the user's hands
    live = page.find("main").attrs["ws-connect"].split("components=")[1].split(",")
    assert live == ["distributed-gate", "nodes", "cluster-options", "plan-preview", "prepare-status",
                    "cluster-monitor"]
    # the form shows the plan's choice to everyone: model, nodes and context
    form = page.by_id("cluster-form")
    assert form.by_id("model").find("option", value="smol").has("selected")
    assert form.find("input", value="n0").has("checked") and form.by_id("context_length").attrs["value"] == "2048"
    # memory-fit bars with a legend and numbers, the layer map, the warning in words
    legend = page.by_id("plan-preview").find_all(**{"class": "legend small"})[0].text
    assert "weights 350 MiB" in legend and "KV cache 200 MiB" in legend and "headroom 100 MiB" in legend
    assert "stage 1 does most of the work" in page.by_id("plan-preview").text
    # live charts
    assert len([e for e in page.find_all("svg") if "spark" in e.attrs.get("class", "")]) >= 3
    assert "tokens/s" in page.text
    assert "credential" not in html and "secret-credential" not in html


def test_sessions_lists_the_cluster_once_with_its_stages_tab(rich: Web):
    html = rich.client("admin").get("/sessions").get_data(as_text=True)
    assert html.count('data-session="smol-2stage-s1"') == 1 and '<span class="badge cluster">Cluster</span>' in html
    assert ">Cluster stages</button>" in html and html.count('class="stage-card state-') == 2
    assert "smol-2stage-s0" not in html  # the failed launch is history, not a session


@pytest.mark.parametrize("path", PAGES)
def test_viewers_see_every_page_but_no_enabled_action(rich: Web, path: str):
    r = rich.client("viewer").get(path)
    html = r.get_data(as_text=True)
    assert r.status_code == 200 and "Viewing only." in html
    enabled = [text for text, disabled in buttons(html) if not disabled and text in ACTION_LABELS]
    assert enabled == (["Send"] if path == "/chat" else []), enabled  # viewers may chat with served models
    assert "Create viewer link" not in html and "Stop cluster" not in html and ">Stop</button>" not in html


def test_the_distributed_tab_explains_how_to_turn_it_on_when_off(web: Web):
    html = web.client("admin").get("/models?tab=distributed").get_data(as_text=True)
    page = parse(html)
    assert "Distributed serving is off" in page.text and "Enable distributed serving" in page.text
    assert not page.find_all(id="cluster-form")
    # live all the same: the tab appears as soon as another admin turns it on
    assert page.find("main").attrs["ws-connect"] == "/ws?components=distributed-gate"
    assert page.by_id("distributed-gate").attrs["data-distributed"] == "off"
    html = web.client("viewer").get("/models?tab=distributed").get_data(as_text=True)
    assert "Only an admin can turn it on." in html


def test_settings_page_holds_the_contract_labels(web: Web):
    html = web.client("admin").get("/settings").get_data(as_text=True)
    for label in ("Enable distributed serving", "Default transport backend", "Transport port range", "Save"):
        assert label in html
    assert 'id="settings-form"' in html and 'value="39600"' in html and 'value="39629"' in html


def test_a_launch_failure_names_the_failed_step_and_what_was_rolled_back(rich: Web):
    state = rich.orch.state
    rich.orch._state = state.model_copy(update={"sessions": ()})  # only the failed launch is left to show
    html = rich.client("admin").get("/models?tab=distributed").get_data(as_text=True)
    assert "Launch failed at “Stage 1 transport listening on port 39602”." in html
    assert "3 steps rolled back" in html and "3 steps never ran" in html and "Address already in use" in html
    assert html.count('class="step-rolled_back"') == 3 and html.count('class="step-failed"') == 1


def test_every_component_renders_alone_for_a_websocket_push(rich: Web):
    from webapp.components import render
    from webapp.views.context import ViewContext

    with rich.app.test_request_context():
        for c in COMPONENTS:
            if c.live:
                element = parse(render(c.name, rich.orch.state, ViewContext(role="viewer"), oob=True)).by_id(c.name)
                assert element.attrs["hx-swap-oob"] == "true"
    assert {c.name for c in COMPONENTS if not c.live} == {"settings-form", "add-node", "cluster-form", "download-form",
                                                          "serve-settings"}
