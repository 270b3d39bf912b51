"""The `make demo` walk in real Chromium over real processes, part 2 of 3
(e2e/dashboard/conftest.py): serve.

The admin launches the cluster prepared in part 1 (the timeline completes, the badge turns
Healthy live), chats with it through the router, sees it once in Sessions with its stages,
and watches it die when a stage is killed (automatic restarts off: the teardown is the
point here; e2e/test_recovery.py has the restart).
"""

from __future__ import annotations

import os
import signal

import pytest
from playwright.sync_api import expect

from e2e.pages import (
    ANSWER_MS,
    LAUNCH_MS,
    LIVE,
    PROCESSES_S,
    ROUTER_S,
    SAVED_S,
    SETTLE_MS,
    badge,
    cluster_rows,
    mark_document,
    monitor,
    nav,
    open_distributed,
    same_document,
)
from orchestrator.demo_stack import MODEL_ID
from orchestrator.proc import wait_until

pytestmark = pytest.mark.incremental(package=True)


# --- 4 ------------------------------------------------------------------------------------

def test_4_launch_timeline_completes_and_turns_healthy_live(stack, admin, viewer, shots):
    page = admin.page
    doc = mark_document(page)
    page.get_by_role("button", name="Launch cluster").click()
    expect(monitor(page)).to_contain_text("Stage 0 starting", timeout=LIVE)
    expect(badge(page, "Healthy")).to_be_visible(timeout=LAUNCH_MS)
    expect(monitor(page)).to_contain_text("Router registered")
    same_document(page, doc)
    [session] = stack.api_state()["sessions"]
    steps = session["timeline"]
    assert [s["state"] for s in steps] == ["done"] * len(steps), steps
    for s in steps:  # every step is on screen
        expect(monitor(page)).to_contain_text(s["label"])
    expect(monitor(page).get_by_text("failed", exact=True)).to_have_count(0)
    expect(page.get_by_role("button", name="Stop cluster")).to_be_visible()
    # one card per stage: its node and layer range
    for st in session["stages"]:
        expect(monitor(page)).to_contain_text(st["node_name"])
        expect(monitor(page)).to_contain_text(f"{st['first_layer']}–{st['last_layer']}")
    wait_until(lambda: MODEL_ID in stack.router_models(), ROUTER_S, message="the router to list the model")
    expect(badge(viewer.page, "Healthy")).to_be_visible(timeout=LIVE)
    expect(viewer.page.get_by_role("button", name="Stop cluster")).to_have_count(0)
    same_document(viewer.page, viewer.document)
    shots(page, "04a-launch-healthy")
    shots(viewer.page, "04b-viewer-healthy")


# --- 5 ------------------------------------------------------------------------------------

RECORD_REPLY = """() => {
  window.__replyLengths = [];
  new MutationObserver(() => {
    const replies = document.querySelectorAll('#chat-log .assistant .text, #chat-log .msg.assistant');
    const last = replies[replies.length - 1];
    const n = last ? last.textContent.length : 0;
    const seen = window.__replyLengths;
    if (n && seen[seen.length - 1] !== n) seen.push(n);
  }).observe(document.getElementById('chat-log'), {childList: true, subtree: true, characterData: true});
}"""


def test_5_chat_through_the_router_streams_a_reply(stack, admin, shots):
    page = admin.page
    nav(page, "Chat")
    picker = page.get_by_label("Model", exact=True)
    expect(picker.locator("option", has_text=MODEL_ID)).to_be_attached(timeout=LIVE)
    picker.select_option(MODEL_ID)
    page.evaluate(RECORD_REPLY)
    page.get_by_label("Message").fill("What is the capital of France?")
    page.get_by_role("button", name="Send").click()
    log = page.locator("#chat-log")
    expect(log).to_contain_text("Paris", timeout=ANSWER_MS)
    expect(log).to_contain_text("tokens/s", timeout=SETTLE_MS)
    expect(log).to_contain_text("time to first token")
    lengths = page.evaluate("() => window.__replyLengths")
    assert len(lengths) >= 3 and lengths == sorted(lengths), f"the reply did not arrive in pieces: {lengths}"
    shots(page, "05-chat")


# --- 6 ------------------------------------------------------------------------------------

def test_6_sessions_lists_the_cluster_once_with_its_stages(stack, admin, shots):
    page = admin.context.new_page()  # a second tab stays on Sessions for step 7
    page.goto(stack.url + "/sessions")
    sessions = page.locator("#sessions")
    expect(cluster_rows(page, MODEL_ID)).to_have_count(1)
    expect(sessions.get_by_role("button", name="Stop", exact=True)).to_have_count(1)
    expect(sessions).to_contain_text(MODEL_ID)
    expect(sessions).to_contain_text("Healthy")
    sessions.get_by_text("Details").click()
    tab = sessions.get_by_role("tab", name="Cluster stages")
    expect(tab).to_be_visible()
    tab.click()
    [session] = stack.api_state()["sessions"]
    for st in session["stages"]:
        expect(sessions).to_contain_text(f"Stage {st['index']}")
        expect(sessions).to_contain_text(f"{st['first_layer']}–{st['last_layer']}")
        expect(sessions).to_contain_text(st["node_name"])
    admin.sessions_page = page
    admin.sessions_document = mark_document(page)
    shots(page, "06-sessions-cluster-stages")


# --- 7 ------------------------------------------------------------------------------------

def test_7_killing_a_stage_turns_the_cluster_unhealthy_and_cleans_up(stack, admin, viewer, shots):
    page = admin.page
    # This step tests the teardown; automatic restarts (on by default) are e2e/test_recovery.py's.
    nav(page, "Settings")
    page.get_by_label("Restart failed stages automatically").uncheck()
    page.get_by_role("button", name="Save").click()
    wait_until(lambda: stack.api_state()["settings"]["auto_restart"] is False, SAVED_S,
               message="automatic restarts to be off")
    expect(page.locator("#settings-status")).to_contain_text("automatic restarts off")
    open_distributed(page)
    expect(badge(page, "Healthy")).to_be_visible()
    doc = mark_document(page)
    [session] = stack.api_state()["sessions"]
    stage1 = next(s for s in session["stages"] if s["index"] == 1)
    victim = next(p for p in stack.clients[stage1["node_name"]].processes()
                  if p.cluster_id == session["id"] and p.node_id == "stage-1" and p.alive)
    os.kill(victim.pid, signal.SIGKILL)

    expect(badge(page, "Unhealthy")).to_be_visible(timeout=LIVE)
    same_document(page, doc)
    sessions = admin.sessions_page.locator("#sessions")
    expect(cluster_rows(admin.sessions_page, MODEL_ID)).to_have_count(0, timeout=LIVE)
    expect(sessions).to_contain_text("No serving sessions")
    same_document(admin.sessions_page, admin.sessions_document)
    wait_until(lambda: MODEL_ID not in stack.router_models(), ROUTER_S, message="the router to drop the model")
    assert stack.router_backends() == []
    wait_until(lambda: not stack.engine_processes(), PROCESSES_S, message="every engine process to end")
    assert stack.api_state()["sessions"] == []
    expect(badge(viewer.page, "Unhealthy")).to_be_visible(timeout=LIVE)
    shots(page, "07a-unhealthy")
    shots(admin.sessions_page, "07b-sessions-empty")
