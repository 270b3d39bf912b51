"""Every page renders for admins and viewers; viewers get no way to act."""

from __future__ import annotations

import pytest

from webapp.components import COMPONENTS

from .conftest import Web, buttons

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
    for element in ("nodes", "cluster-form", "plan-preview", "prepare-status", "cluster-monitor"):
        assert f'id="{element}"' in html
    for label in ("Add node", "Register", "Model", "Preview shard plan", "Prepare on all nodes", "Launch cluster",
                  "Stop cluster", "Healthy", "Present", "Needs download", "Unsupported: unreachable"):
        assert label in html, label
    assert 'ws-connect="/ws?components=nodes,cluster-form,plan-preview,prepare-status,cluster-monitor"' in html
    # the form shows the plan's choice to everyone: model, nodes and context
    assert '<option value="smol"  selected>' in html and 'value="n0" checked' in html and 'value="2048"' in html
    # memory-fit bars with a legend and numbers, the layer map, the warning in words
    assert "weights <strong>350 MiB</strong>" in html and "KV cache <strong>200 MiB</strong>" in html
    assert "headroom <strong>100 MiB</strong>" in html and "stage 1 does most of the work" in html
    # live charts
    assert html.count('class="spark ') >= 3 and "tokens/s" in html
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
    assert "Distributed serving is off" in html and "Enable distributed serving" in html
    assert 'id="cluster-form"' not in html and "ws-connect" not in html
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
            html = render(c.name, rich.orch.state, ViewContext(role="viewer"), oob=True)
            assert f'id="{c.name}"' in html and 'hx-swap-oob="true"' in html
