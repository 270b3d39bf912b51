"""Issue 38, done-when: the whole dashboard stopped for longer than the engines' lease, then
started again over the same state directory (agents and router left running), finds the same
session, relaunches it under the same plan, and shows it Healthy and answering exactly — the
timeline explaining what was relaunched — in the page the admin kept open. Ordered steps
(`incremental`) over their own `make demo` stack, its dashboard started with a 6 s lease.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from playwright.sync_api import expect

from e2e.conftest import Stack, running_stack
from e2e.pages import (
    LAUNCH_MS,
    LIVE,
    PROCESSES_S,
    ROUTER_S,
    SAVED_S,
    add_nodes,
    badge,
    log_in,
    monitor,
    nav,
    open_distributed,
    prepare_and_launch,
    save_distributed_settings,
    select_cluster,
)
from orchestrator.demo_stack import MODEL_ID
from orchestrator.proc import wait_until

pytestmark = pytest.mark.incremental

LEASE_S = 6  # the dashboard's --lease-s here: short, so stopping it for longer costs a test little
# The agents stop every engine once the lease lapsed (a SIGTERM grace included): a bound, not a target
GONE_S = LEASE_S + PROCESSES_S
QUESTION = "What is the capital of France?"


@pytest.fixture(scope="module")
def stack(demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with running_stack(demo_model, tmp_path_factory.mktemp("e2e-restart"),
                       dashboard_args=["--lease-s", str(LEASE_S)]) as s:
        yield s


def ask(stack: Stack) -> str:
    """One greedy chat answer through the router."""
    r = requests.post(stack.demo.router_url + "/v1/chat/completions", timeout=120,
                      json={"model": MODEL_ID, "max_tokens": 12, "temperature": 0,
                            "messages": [{"role": "user", "content": QUESTION}]})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def engines(stack: Stack, session_id: str) -> dict[str, int]:
    """The session's live engine processes (name -> pid), as its agents report them."""
    return {p.node_id: p.pid for c in stack.clients.values() for p in c.processes()
            if p.cluster_id == session_id and p.alive}


def test_1_a_healthy_cluster_answers(stack, admin, shots):
    page = admin.page
    log_in(page, stack.url, stack.demo.admin_token)
    nav(page, "Settings")
    save_distributed_settings(page, stack.transport)
    wait_until(lambda: stack.api_state()["settings"]["distributed_enabled"], SAVED_S, message="the settings saved")
    open_distributed(page)
    add_nodes(page, stack.nodes("node-a", "node-b"))
    select_cluster(page, MODEL_ID, ("node-a", "node-b"))
    page.get_by_role("button", name="Preview shard plan").click()
    expect(page.locator("#plan-preview")).to_contain_text("node-b")
    prepare_and_launch(page, healthy_within_ms=LAUNCH_MS)
    wait_until(lambda: MODEL_ID in stack.router_models(), ROUTER_S, message="the router to list the model")
    stack.answer = ask(stack)
    [session] = stack.api_state()["sessions"]
    stack.session_id, stack.before = session["id"], engines(stack, session["id"])
    assert set(stack.before) == {"stage-0", "stage-1", "coordinator"}, stack.before
    shots(page, "restart-1-healthy")


def test_2_the_dashboard_stopped_for_longer_than_the_lease_loses_its_engines(stack, admin):
    stack.demo.stop_dashboard()
    # Longer than the lease: until the agents have stopped every engine of the session.
    wait_until(lambda: not engines(stack, stack.session_id), GONE_S, 0.5,
               message="the agents stopping the engines once their lease lapsed")


def test_3_started_again_it_relaunches_the_same_session_under_the_same_plan(stack, admin, shots):
    stack.demo.start_dashboard()
    page = admin.page  # the page the admin kept open: its live feed comes back by itself
    wait_until(lambda: (s := stack.api_state()["sessions"]) and s[0]["faults"]
               and s[0]["faults"][-1]["outcome"] != "recovering", LAUNCH_MS / 1000, 0.5,
               message="the relaunch to end")
    expect(badge(page, "Healthy")).to_be_visible(timeout=LIVE)
    [session] = stack.api_state()["sessions"]
    assert session["id"] == stack.session_id and session["health"] == "Healthy", session["reason"]
    fault = session["faults"][-1]
    assert fault["relaunch"] and fault["outcome"] == "recovered", fault
    assert fault["processes"] == ["stage-0", "stage-1", "coordinator"], fault
    after = engines(stack, stack.session_id)
    assert set(after) == set(stack.before) and not set(after.values()) & set(stack.before.values())
    # the timeline says what was relaunched, where, in the launch's order
    for text in ("Relaunch after the dashboard's restart: Stage 0 started again on node-a",
                 "Relaunch after the dashboard's restart: Stage 1 started again on node-b",
                 "Relaunch after the dashboard's restart: Coordinator started again on node-a",
                 "Relaunch after the dashboard's restart: router routes to it again"):
        expect(monitor(page)).to_contain_text(text, timeout=LIVE)
    expect(monitor(page)).not_to_contain_text("HTTPConnectionPool")
    expect(monitor(page)).not_to_contain_text("None)")
    shots(page, "restart-3-relaunched")
    wait_until(lambda: MODEL_ID in stack.router_models(), ROUTER_S, message="the router to list the model again")
    assert ask(stack) == stack.answer  # the same plan answers exactly as before the restart
    assert stack.router_backends() == [session["name"]]  # never registered twice
