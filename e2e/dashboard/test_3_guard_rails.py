"""The `make demo` walk in real Chromium over real processes, part 3 of 3
(e2e/dashboard/conftest.py): guard rails.

The viewer whose page opened in part 1 shows what the admin's shows and cannot act (no
button to press, and the server refuses every action anyway); a launch that hits a port
taken meanwhile fails visibly and leaves nothing behind.
"""

from __future__ import annotations

import socket

import pytest
from playwright.sync_api import Page, expect

from e2e.pages import LAUNCH_MS, LIVE, LIVE_S, PROCESSES_S, SAVED_S, badge, monitor, same_document, select_cluster
from orchestrator.demo_stack import MODEL_ID
from orchestrator.proc import WaitTimeout, wait_until

pytestmark = pytest.mark.incremental(package=True)

TWO_NODES = ("node-a", "node-b")


# --- 8 ------------------------------------------------------------------------------------

def test_8_a_viewer_sees_the_same_live_state_and_cannot_act(stack, admin, viewer, shots):
    v = viewer.page
    same_document(v, viewer.document)  # everything it shows arrived live since step 1
    expect(v.get_by_text("Viewer", exact=True)).to_be_visible()
    for component in ("#nodes", "#plan-preview", "#prepare-status", "#cluster-monitor"):
        # Both pages follow the same pushes, read one after the other: live figures (a node's
        # load in the prediction) may move between the two reads, so they must converge.
        try:
            wait_until(lambda c=component: shown(v, c) == shown(admin.page, c), LIVE_S, 0.2,
                       f"{component} to show the same on both pages")
        except WaitTimeout:
            assert shown(v, component) == shown(admin.page, component), component
    expect(badge(v, "Unhealthy")).to_be_visible()

    # a live change made by the admin reaches the viewer without a reload
    page = admin.page
    select_cluster(page, MODEL_ID, TWO_NODES)
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
        session = wait_until(lambda: next(iter(stack.api_state()["sessions"]), None), SAVED_S,
                             message="the new session", interval=0.01)
        port = next(s["port"] for s in session["stages"] if s["index"] == 1)
        blocker.bind(("127.0.0.1", port))
        blocker.listen(1)
        expect(badge(page, "Stopped")).to_be_visible(timeout=LAUNCH_MS)
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
        wait_until(lambda: not stack.engine_processes(), PROCESSES_S, message="every engine process to end")
        assert stack.api_state()["sessions"] == []
        assert stack.router_backends() == [] and MODEL_ID not in stack.router_models()
        expect(badge(viewer.page, "Stopped")).to_be_visible(timeout=LIVE)
        shots(page, "09-failed-launch")
    finally:
        blocker.close()
