"""Issue 10 in real Chromium over real processes: a killed stage comes back by itself while
the other stages keep their processes (same PIDs) and weights, and the dashboard shows it
live — recovery steps in the timeline, stage progress on the cards, the fault's post-mortem
in the Sessions drawer. Ordered steps (`incremental`) over their own `make demo` stack.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest
import requests
from playwright.sync_api import expect

from e2e.pages import (
    LIVE,
    PROCESSES_S,
    RECOVERED_S,
    ROUTER_S,
    SAVED_S,
    STOPPED_S,
    add_nodes,
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

RECORD_HEALTH = """() => {
  window.__healthSeen = [];
  const look = () => {
    const el = document.getElementById('cluster-health');
    const seen = window.__healthSeen;
    if (el && seen[seen.length - 1] !== el.textContent) seen.push(el.textContent);
  };
  new MutationObserver(look).observe(document.body, {childList: true, subtree: true, characterData: true});
}"""


def session_pids(stack, session: dict) -> dict[str, int]:
    """PID of each live process of the session, by name, as its agents report them."""
    return {p.node_id: p.pid for c in stack.clients.values() for p in c.processes()
            if p.cluster_id == session["id"] and p.alive}


def test_1_launch_a_two_stage_cluster_with_automatic_restarts_on(stack, admin, shots):
    page = admin.page
    log_in(page, stack.url, stack.demo.admin_token)
    nav(page, "Settings")
    expect(page.get_by_label("Restart failed stages automatically")).to_be_checked()  # on by default
    save_distributed_settings(page, stack.transport)
    wait_until(lambda: stack.api_state()["settings"]["distributed_enabled"], SAVED_S,
               message="the settings to be saved")
    assert stack.api_state()["settings"]["auto_restart"] is True
    open_distributed(page)
    add_nodes(page, stack.nodes("node-a", "node-b"))
    select_cluster(page, MODEL_ID, ("node-a", "node-b"))
    page.get_by_role("button", name="Preview shard plan").click()
    expect(page.locator("#plan-preview")).to_contain_text("node-b")
    prepare_and_launch(page, healthy_within_ms=180_000)
    wait_until(lambda: MODEL_ID in stack.router_models(), ROUTER_S, message="the router to list the model")
    shots(page, "r1-healthy")


def test_2_a_killed_stage_comes_back_and_the_other_processes_keep_their_pids(stack, admin, shots):
    page = admin.page
    [session] = stack.api_state()["sessions"]
    before = session_pids(stack, session)
    assert set(before) == {"stage-0", "stage-1", "coordinator"}, before
    # the stage cards show each stage's progress, live
    expect(monitor(page).locator("[data-progress='1']")).to_contain_text("steps", timeout=LIVE)
    page.evaluate(RECORD_HEALTH)
    killed = time.monotonic()
    os.kill(before["stage-1"], signal.SIGKILL)

    expect(monitor(page)).to_contain_text("Recovery 1: Stage 1 restarting on", timeout=LIVE)
    wait_until(lambda: (s := stack.api_state()["sessions"]) and s[0]["faults"] and s[0]["phase"] == "running"
          and s[0]["faults"][-1]["outcome"] == "recovered", RECOVERED_S, message="the session to recover")
    took = time.monotonic() - killed
    expect(monitor(page).locator("#cluster-health")).to_have_text("Healthy", timeout=LIVE)
    seen = page.evaluate("() => window.__healthSeen")
    assert "Unhealthy" in seen and seen[-1] == "Healthy", seen  # the badge went through the fault, live
    after = session_pids(stack, session)
    assert after["stage-1"] != before["stage-1"]
    assert after["stage-0"] == before["stage-0"] and after["coordinator"] == before["coordinator"], (before, after)
    [session] = stack.api_state()["sessions"]
    steps = [t for t in session["timeline"] if t["key"].startswith("recovery-1.1.")]
    assert steps and all(t["state"] == "done" for t in steps), steps
    for t in steps:
        expect(monitor(page)).to_contain_text(t["label"])
    wait_until(lambda: MODEL_ID in stack.router_models(), ROUTER_S, message="the router to list the model again")
    r = requests.post(stack.demo.router_url + "/v1/chat/completions", timeout=120,
                      json={"model": MODEL_ID, "max_tokens": 8, "temperature": 0,
                            "messages": [{"role": "user", "content": "What is the capital of France?"}]})
    assert r.status_code == 200, r.text
    shots(page, "r2-recovered")
    print(f"kill -9 of stage-1 -> Healthy again: {took:.1f} s (fault seen -> Healthy: "
          f"{session['faults'][-1]['recovery_s']} s)")


def test_3_the_sessions_drawer_keeps_the_fault_and_its_post_mortem(stack, admin, shots):
    page = admin.page
    nav(page, "Sessions")
    sessions = page.locator("#sessions")
    sessions.get_by_text("Details").click()
    sessions.get_by_role("tab", name=re.compile("Faults")).click()
    expect(sessions).to_contain_text("recovered in")
    post_mortem = sessions.locator("details.post-mortem").first
    expect(post_mortem).to_contain_text("stage-1")
    expect(post_mortem).to_contain_text("SIGKILL")
    post_mortem.locator("summary").click()
    expect(post_mortem.locator("pre")).not_to_have_text("(no output kept)")
    shots(page, "r3-post-mortem")
    [session] = stack.api_state()["sessions"]
    page.get_by_role("button", name="Stop", exact=True).click()
    wait_until(lambda: not stack.api_state()["sessions"], STOPPED_S, message="the session to stop")
    wait_until(lambda: not stack.engine_processes(), PROCESSES_S, message="every engine process to end")
    assert stack.router_backends() == []
