"""The whole `make demo` walk-through (README "Two commands") in real Chromium, over real
processes, in nine ordered steps.

An admin logs in, turns distributed serving on, registers three nodes, plans SmolLM2 over
two of them, prepares it (a real copy from the only node that has it), launches it, chats
with it through the router, sees it in Sessions, watches it die when a stage is killed;
a viewer watches all of it live and cannot act; a launch that hits a taken port fails
visibly and leaves nothing behind. Everything is found by its visible label.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import time

import pytest
from playwright.sync_api import Page, expect

from e2e.pages import (add_discovered_node, add_node, enable_distributed_serving, entry, monitor, nav, node_entry,
                       node_toggle, open_distributed, save_distributed_settings, submit_login)
from orchestrator.demo_stack import MODEL_ID
from orchestrator.proc import wait_until  # noqa: F401 (used by the tests here)

pytestmark = pytest.mark.incremental

LIVE = 20_000  # ms: a pushed change must show up well within this without a reload


def mark_document(page: Page) -> str:
    """Tag the loaded document; `same_document` proves later that it was never reloaded."""
    token = f"doc-{time.monotonic_ns()}"
    page.evaluate("t => { window.__e2eDocument = t; }", token)
    return token


def same_document(page: Page, token: str) -> None:
    assert page.evaluate("() => window.__e2eDocument") == token, "the page was reloaded"


def select_cluster(page: Page, nodes: tuple[str, ...] = ("node-a", "node-b")) -> None:
    """Model SmolLM2 and the given node toggles in the Serve as cluster form."""
    page.get_by_label("Model", exact=True).select_option(MODEL_ID)
    for name in nodes:
        node_toggle(page, name).check()


def cluster_rows(page: Page):
    """Sessions rows (table rows or list items) that carry the Cluster badge."""
    return page.locator("#sessions").locator("tr, li").filter(has=page.get_by_text("Cluster", exact=True)) \
        .filter(has_text=MODEL_ID)


def badge(page: Page, text: str):
    """The cluster monitor's aggregate health badge reading `text`."""
    return monitor(page).get_by_text(text, exact=True).first


# --- 1 ------------------------------------------------------------------------------------

def test_1_log_in_enable_distributed_serving_register_nodes(stack, admin, viewer, shots):
    page = admin.page
    page.goto(stack.url)
    expect(page).to_have_url(re.compile(r"/login"))
    shots(page, "01a-login")
    submit_login(page, "not-the-token")
    expect(page.get_by_role("alert")).to_contain_text("not valid")
    submit_login(page, stack.demo.admin_token)
    expect(page.get_by_text("Distributed serving is off")).to_be_visible()
    shots(page, "01b-distributed-off")

    first, last = stack.transport
    enable_distributed_serving(page, (last, first))
    expect(page.get_by_role("alert")).to_contain_text("start must not exceed the end")
    assert stack.api_state()["settings"]["distributed_enabled"] is False  # a rejected form changes nothing
    save_distributed_settings(page, (first, last))
    settings = wait_until(lambda: (st := stack.api_state()["settings"])["distributed_enabled"] and st, 10,
                        message="the settings to be saved")
    assert (settings["port_start"], settings["port_end"]) == (first, last)
    expect(page.get_by_role("alert")).to_have_count(0)
    expect(page.get_by_label("Enable distributed serving")).to_be_checked()

    # A viewer link for step 8's second browser, which watches from now on without reloading.
    page.get_by_role("button", name="Create viewer link").click()
    link = wait_until(lambda: re.search(r"https?://[^\s\"'<]+/viewer/[\w-]+",
                                      page.locator("#new-viewer-link").inner_html()), 10, message="a viewer link")
    shots(page, "01c-settings")
    viewer.page.goto(link.group(0))
    expect(viewer.page.get_by_role("heading", name="Serve as cluster")).to_be_visible()
    expect(viewer.page.get_by_text("Viewer", exact=True)).to_be_visible()
    viewer.document = mark_document(viewer.page)

    open_distributed(page)
    for name in ("node-a", "node-b"):
        node = stack.node(name)
        add_node(page, name, node.address, node.token)
    # node-c through discovery (zeroconf on 127.0.0.1): a hint that still needs the token.
    c = stack.node("node-c")
    add_discovered_node(page, c.name, c.address, c.token)
    for name in ("node-a", "node-b", "node-c"):
        expect(node_entry(page, name)).to_contain_text("Reachable")
        # the viewer sees every node arrive, live
        expect(node_entry(viewer.page, name)).to_contain_text("Reachable")
    assert len(stack.api_state()["nodes"]) == 3
    shots(page, "01d-nodes")


# --- 2 ------------------------------------------------------------------------------------

def test_2_select_model_and_two_nodes_preview_plan(stack, admin, viewer, shots):
    page = admin.page
    option = page.get_by_label("Model", exact=True).locator("option", has_text=MODEL_ID)
    expect(option).to_be_enabled()
    for name in ("node-a", "node-b", "node-c"):
        expect(node_toggle(page, name)).to_be_enabled()
    select_cluster(page)
    page.get_by_role("button", name="Preview shard plan").click()
    plan = page.locator("#plan-preview")
    expect(plan).to_contain_text("node-a")
    expect(plan).to_contain_text("node-b")
    expect(plan).not_to_contain_text("node-c")
    text = plan.inner_text()
    ranges = re.findall(r"layers (\d+)\s*[–-]\s*(\d+)", text)
    assert [int(a) for a, _ in ranges][:1] == [0] and int(ranges[-1][1]) == 29, text  # 30 layers, all covered
    bars = plan.get_by_role("img", name=re.compile("memory fit"))
    expect(bars).to_have_count(2)
    for i in range(2):  # weights, KV cache and overhead segments, each with a width
        widths = bars.nth(i).evaluate("el => [...el.children].map(c => c.getBoundingClientRect().width)")
        assert len(widths) == 3 and all(w > 0 for w in widths), widths
    kv_before = bars.nth(0).evaluate("el => el.children[1].getBoundingClientRect().width")

    # the context-length control re-plans: a shorter context means a smaller KV cache (at 2048
    # tokens the model still fits on no single node; at 1024 it would, and the plan would warn)
    page.get_by_label("Context length").fill("2048")
    page.get_by_label("Context length").dispatch_event("change")
    expect(plan).to_contain_text("2048")
    wait_until(lambda: bars.nth(0).evaluate("el => el.children[1].getBoundingClientRect().width") < kv_before,
             10, message="the KV-cache bar to shrink")
    assert stack.api_state()["sessions"] == []  # a preview starts nothing
    expect(viewer.page.locator("#plan-preview")).to_contain_text("2048", timeout=LIVE)  # live for the viewer
    shots(page, "02-plan")


# --- 3 ------------------------------------------------------------------------------------

RECORD_PREPARE = """() => {
  window.__prepareSeen = [];
  const labels = /(Needs download|Downloading|Present|Mismatch|Checking|Failed)/g;
  const look = () => {
    for (const row of document.querySelectorAll('#prepare-status tr, #prepare-status li')) {
      if (!/node-b/.test(row.textContent)) continue;
      const text = [...row.textContent.matchAll(labels)].map(m => m[1]).join('+');
      const seen = window.__prepareSeen;
      if (text && seen[seen.length - 1] !== text) seen.push(text);
    }
  };
  new MutationObserver(look).observe(document.body, {childList: true, subtree: true, characterData: true});
}"""


def test_3_prepare_copies_the_model_to_the_node_that_lacks_it(stack, admin, viewer, shots):
    page = admin.page
    b_models = stack.node("node-b").models_dir / MODEL_ID
    assert not b_models.exists()
    page.evaluate(RECORD_PREPARE)
    page.get_by_role("button", name="Prepare on all nodes").click()
    prep = page.locator("#prepare-status")
    row_b = entry(page, "#prepare-status", "node-b")
    expect(row_b).to_contain_text("Needs download")
    expect(row_b).to_contain_text("Downloading")
    expect(row_b.get_by_role("progressbar")).to_be_attached()
    expect(row_b).to_contain_text(re.compile(r"\b[1-9]\d?%"))  # under way: 1-99 %
    shots(page, "03a-prepare-copying")
    expect(row_b).to_contain_text("Present", timeout=120_000)
    expect(row_b).not_to_contain_text("Needs download")
    expect(entry(page, "#prepare-status", "node-a")).to_contain_text("Present")
    expect(prep).to_contain_text("ready to launch")
    seen = page.evaluate("() => window.__prepareSeen")
    first_need = next(i for i, s in enumerate(seen) if "Needs download" in s)
    assert seen[-1] == "Present" and first_need < len(seen) - 1, seen
    # the copy is real, complete and verified; node-c was not selected and got nothing
    assert (b_models / "model.safetensors").stat().st_size == \
        (stack.node("node-a").models_dir / MODEL_ID / "model.safetensors").stat().st_size
    assert not (stack.node("node-c").models_dir / MODEL_ID).exists()
    expect(viewer.page.locator("#prepare-status")).to_contain_text("ready to launch", timeout=LIVE)
    shots(page, "03b-prepare-done")


# --- 4 ------------------------------------------------------------------------------------

def test_4_launch_timeline_completes_and_turns_healthy_live(stack, admin, viewer, shots):
    page = admin.page
    doc = mark_document(page)
    page.get_by_role("button", name="Launch cluster").click()
    expect(monitor(page)).to_contain_text("Stage 0 starting", timeout=LIVE)
    expect(badge(page, "Healthy")).to_be_visible(timeout=180_000)
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
    wait_until(lambda: MODEL_ID in stack.router_models(), 30, message="the router to list the model")
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
    expect(log).to_contain_text("Paris", timeout=90_000)
    expect(log).to_contain_text("tokens/s", timeout=60_000)
    expect(log).to_contain_text("time to first token")
    lengths = page.evaluate("() => window.__replyLengths")
    assert len(lengths) >= 3 and lengths == sorted(lengths), f"the reply did not arrive in pieces: {lengths}"
    shots(page, "05-chat")


# --- 6 ------------------------------------------------------------------------------------

def test_6_sessions_lists_the_cluster_once_with_its_stages(stack, admin, shots):
    page = admin.context.new_page()  # a second tab stays on Sessions for step 7
    page.goto(stack.url + "/sessions")
    sessions = page.locator("#sessions")
    expect(cluster_rows(page)).to_have_count(1)
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
    wait_until(lambda: stack.api_state()["settings"]["auto_restart"] is False, 10,
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
    expect(cluster_rows(admin.sessions_page)).to_have_count(0, timeout=LIVE)
    expect(sessions).to_contain_text("No serving sessions")
    same_document(admin.sessions_page, admin.sessions_document)
    wait_until(lambda: MODEL_ID not in stack.router_models(), 20, message="the router to drop the model")
    assert stack.router_backends() == []
    wait_until(lambda: not stack.engine_processes(), 20, message="every engine process to end")
    assert stack.api_state()["sessions"] == []
    expect(badge(viewer.page, "Unhealthy")).to_be_visible(timeout=LIVE)
    shots(page, "07a-unhealthy")
    shots(admin.sessions_page, "07b-sessions-empty")


# --- 8 ------------------------------------------------------------------------------------

def test_8_a_viewer_sees_the_same_live_state_and_cannot_act(stack, admin, viewer, shots):
    v = viewer.page
    same_document(v, viewer.document)  # everything it shows arrived live since step 1
    expect(v.get_by_text("Viewer", exact=True)).to_be_visible()
    for component in ("#nodes", "#plan-preview", "#prepare-status", "#cluster-monitor"):
        assert shown(v, component) == shown(admin.page, component), component
    expect(badge(v, "Unhealthy")).to_be_visible()

    # a live change made by the admin reaches the viewer without a reload
    page = admin.page
    select_cluster(page)
    page.get_by_label("Context length").fill("3072")
    page.get_by_role("button", name="Preview shard plan").click()
    expect(page.locator("#plan-preview")).to_contain_text("3072")
    expect(v.locator("#plan-preview")).to_contain_text("3072", timeout=LIVE)
    same_document(v, viewer.document)

    # nothing to act with: buttons absent or disabled
    for name in ("Add node", "Register", "Remove", "Preview shard plan", "Prepare on all nodes", "Launch cluster",
                 "Stop cluster"):
        cannot_press(v, name)
    expect(v.get_by_label("Model", exact=True)).to_be_disabled()
    shots(v, "08a-viewer-distributed")
    other = viewer.context.new_page()
    other.goto(stack.url + "/settings")
    expect(other.get_by_label("Enable distributed serving")).to_be_disabled()
    for name in ("Save", "Create viewer link"):
        cannot_press(other, name)
    shots(other, "08b-viewer-settings")
    other.goto(stack.url + "/sessions")
    cannot_press(other, "Stop")
    csrf = other.locator('meta[name="csrf-token"]').get_attribute("content")

    # ... and the server refuses anyway, with or without the viewer's CSRF token
    before = stack.api_state()
    node_ids = [n["id"] for n in before["nodes"]][:2]
    attempts = [("/settings/distributed", {"port_start": "2000", "port_end": "2100", "transport_backend": "tcp"}),
                ("/nodes", {"address": stack.node("node-a").address, "token": stack.node("node-a").token}),
                (f"/nodes/{node_ids[0]}/remove", {}),
                ("/cluster/plan", {"model": MODEL_ID, "nodes": node_ids[0]}),
                ("/cluster/prepare", {"model": MODEL_ID, "nodes": node_ids[0]}),
                ("/cluster/launch", {"model": MODEL_ID, "nodes": node_ids[0]}),
                ("/sessions/0123456789ab/stop", {}),
                ("/settings/viewer-links", {"label": "sneaky"})]
    for path, form in attempts:
        for headers in ({"X-CSRF-Token": csrf}, {}):
            r = viewer.context.request.post(stack.url + path, form=form, headers=headers)
            assert r.status == 403, (path, headers, r.status, r.text()[:200])
    r = viewer.context.request.post(stack.url + "/chat/send", data={"model": MODEL_ID, "messages": []},
                                    headers={"X-CSRF-Token": "wrong"})
    assert r.status in (400, 403), r.status
    after = stack.api_state()
    for key in ("settings", "nodes", "sessions", "preparation"):
        assert _stable(after[key]) == _stable(before[key]), key
    other.close()


def cannot_press(page: Page, name: str) -> None:
    """No button `name`, or only disabled ones."""
    buttons = page.get_by_role("button", name=name, exact=True)
    states = [buttons.nth(i).is_disabled() for i in range(buttons.count())]
    assert all(states), f"a viewer can press {name!r}"


def shown(page: Page, component: str) -> list[str]:
    """The words a component shows, without its controls (which only admins get)."""
    return page.locator(component).evaluate("""el => {
        const c = el.cloneNode(true);
        c.querySelectorAll('form, button, input, select, textarea, label').forEach(n => n.remove());
        return c.textContent.split(/\\s+/).filter(Boolean);
    }""")


def _stable(value):
    """State without what changes by itself (reports, timestamps)."""
    if isinstance(value, dict):
        return {k: _stable(v) for k, v in value.items() if k not in ("report", "last_seen", "error", "status")}
    if isinstance(value, list):
        return [_stable(v) for v in value]
    return value


# --- 9 ------------------------------------------------------------------------------------

def test_9_a_launch_that_hits_a_taken_port_fails_visibly_and_leaves_nothing(stack, admin, viewer, shots):
    page = admin.page
    expect(page.get_by_role("button", name="Launch cluster")).to_be_enabled()
    blocker = socket.socket()
    blocker.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port may linger in TIME_WAIT after step 7
    try:
        page.get_by_role("button", name="Launch cluster").click()
        # The plan gave stage 1 a port; take it before stage 1 starts (stage 0 loads first).
        session = wait_until(lambda: next(iter(stack.api_state()["sessions"]), None), 10, message="the new session",
                           interval=0.01)
        port = next(s["port"] for s in session["stages"] if s["index"] == 1)
        blocker.bind(("127.0.0.1", port))
        blocker.listen(1)
        expect(badge(page, "Stopped")).to_be_visible(timeout=180_000)
        s = next(h for h in stack.api_state()["history"] if h["id"] == session["id"])
        failed = [t for t in s["timeline"] if t["state"] == "failed"]
        assert len(failed) == 1 and failed[0]["key"].startswith("stage-1"), s["timeline"]
        assert any(t["state"] == "rolled_back" for t in s["timeline"]), s["timeline"]
        mon = monitor(page)
        expect(mon).to_contain_text(failed[0]["label"])
        expect(mon.get_by_text("failed", exact=True)).to_have_count(1)
        expect(mon.get_by_text("rolled back", exact=True).first).to_be_visible()
        expect(mon).to_contain_text(str(port))
        # nothing left running, nothing registered
        wait_until(lambda: not stack.engine_processes(), 20, message="every engine process to end")
        assert stack.api_state()["sessions"] == []
        assert stack.router_backends() == [] and MODEL_ID not in stack.router_models()
        expect(badge(viewer.page, "Stopped")).to_be_visible(timeout=LIVE)
        shots(page, "09-failed-launch")
    finally:
        blocker.close()
