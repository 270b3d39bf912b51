"""Issue 12's rough edges, seen in real Chromium as a new user would, over their own `make demo`
stack (e2e/conftest.py): the gated Distributed tab appears live when another admin turns it on;
sizes are in binary units everywhere; a live push never undoes what the user is choosing;
Prepare never starts at "100 % · 0 B / 0 B"; the badge says Healthy only with its facts; Launch
is disabled with the reason while the nodes serve the model, and the plan stays; after Stop the
nodes' free memory comes back. Ordered steps (`incremental`): `admin` and `viewer` are two
people, here both admins.
"""

from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import Locator, Page, expect

from e2e.pages import (
    LAUNCH_MS,
    LIVE,
    LIVE_S,
    PREPARE_MS,
    SETTLE_MS,
    add_node,
    add_nodes,
    log_in,
    node_toggle,
    save_distributed_settings,
    select_cluster,
)
from orchestrator.demo_stack import MODEL_ID
from orchestrator.proc import wait_until

pytestmark = pytest.mark.incremental

DECIMAL_UNITS = re.compile(r"\d\s?(?:KB|MB|GB|TB)\b")

RECORD = """() => {
  // every moment of the Preparation rows and of the health badge beside the stage cards
  window.__prep = []; window.__health = [];
  const look = () => {
    for (const row of document.querySelectorAll('#prepare-status tr[data-node]')) window.__prep.push(row.textContent);
    const badge = document.getElementById('cluster-health');
    if (badge) window.__health.push([badge.textContent, document.getElementById('cluster-monitor').textContent]);
  };
  new MutationObserver(look).observe(document.body, {childList: true, subtree: true, characterData: true});
}"""


def node_choice(page: Page, name: str) -> Locator:
    """Node `name`'s choice in the cluster form: its checkbox with the label (name, free memory)."""
    return page.locator("#cluster-form label").filter(has=node_toggle(page, name))


def test_1_the_distributed_tab_appears_live_when_another_admin_turns_it_on(stack, admin, viewer):
    page, other = admin.page, viewer.page
    log_in(page, stack.url, stack.demo.admin_token)
    page.get_by_role("tab", name="Distributed").click()  # off: the landing page is Local
    expect(page.get_by_text("Distributed serving is off")).to_be_visible()
    expect(page.get_by_text("Live", exact=True)).to_be_visible(timeout=LIVE)  # the gated page has a live socket
    log_in(other, stack.url, stack.demo.admin_token)
    other.goto(stack.url + "/settings")
    save_distributed_settings(other, stack.transport)
    expect(other.locator("#settings-status")).to_contain_text("On")
    # no click, no reload by hand
    expect(page.get_by_role("heading", name="Serve as cluster")).to_be_visible(timeout=LIVE)


def test_2_sizes_are_binary_units_everywhere(stack, admin):
    page = admin.page
    add_nodes(page, stack.nodes("node-a", "node-b"))
    # 1100M budgets: 1.07 GiB, not "1.2 GB"
    expect(node_choice(page, "node-a")).to_contain_text(re.compile(r"\d+(\.\d+)? (GiB|MiB) memory free"), timeout=LIVE)
    select_cluster(page, MODEL_ID, ("node-a", "node-b"))
    page.get_by_role("button", name="Preview shard plan").click()
    expect(page.locator("#plan-preview")).to_contain_text("MiB")
    for component in ("#nodes", "#cluster-form", "#plan-preview"):
        text = page.locator(component).inner_text()
        assert not DECIMAL_UNITS.search(text), (component, DECIMAL_UNITS.search(text).group(0))


def test_3_a_live_push_keeps_what_the_user_is_choosing(stack, admin, viewer):
    page = admin.page
    node_toggle(page, "node-b").uncheck()  # unsaved: only node-a now
    page.get_by_label("Context length").fill("3072")  # typed, not submitted
    # another admin registers node-c: what the form offers changes and reaches this page live
    other = viewer.page
    other.goto(stack.url + "/models?tab=distributed")
    c = stack.node("node-c")
    add_node(other, c.name, c.address, c.token)
    expect(node_toggle(page, "node-c")).to_be_visible(timeout=LIVE)
    expect(node_toggle(page, "node-a")).to_be_checked()
    expect(node_toggle(page, "node-b")).not_to_be_checked()
    expect(page.get_by_label("Context length")).to_have_value("3072")
    node_toggle(page, "node-b").check()
    page.get_by_label("Context length").fill("2048")


def test_4_prepare_never_starts_at_100_percent(stack, admin):
    page = admin.page
    page.evaluate(RECORD)
    # A live refresh of the form (test 3 added a node) swaps only the choices and the Launch
    # button, never this button: the click cannot be lost to a push.
    page.get_by_role("button", name="Prepare on all nodes").click()
    started = page.locator("#prepare-status tr[data-node]").first
    refused = page.locator("#cluster-form [role=alert]")
    expect(started.or_(refused)).to_be_visible(timeout=SETTLE_MS)
    assert not refused.is_visible(), refused.text_content()
    expect(page.locator("#prepare-status")).to_contain_text("ready to launch", timeout=PREPARE_MS)
    seen = page.evaluate("() => window.__prep")
    assert seen, "no Preparation row was ever shown"
    wrong = [t for t in seen if "0 B / 0 B" in t or ("Checking" in t and "100%" in t)]
    assert not wrong, wrong


def test_5_healthy_only_with_the_facts_that_make_it_so(stack, admin):
    page = admin.page
    page.get_by_role("button", name="Launch cluster").click()
    health = page.locator("#cluster-health")
    expect(health).to_have_text("Healthy", timeout=LAUNCH_MS)
    moments = page.evaluate("() => window.__health")
    healthy = [text for badge, text in moments if badge.strip() == "Healthy"]
    assert healthy and not [t for t in healthy if "not seen yet" in t], "Healthy beside unseen stages"
    for card in page.locator("#cluster-monitor .stage-card").all():
        expect(card).to_contain_text("Process alive")
        expect(card).to_contain_text("Transport listening")


def test_6_launch_says_why_it_is_disabled_and_the_plan_stays(stack, admin):
    page = admin.page
    launch = page.get_by_role("button", name="Launch cluster")
    expect(launch).to_be_disabled(timeout=LIVE)
    expect(page.locator("#launch-why")).to_contain_text("already serve")
    expect(page.locator("#launch-why")).to_contain_text("stop that cluster first")
    plan = page.locator("#plan-preview")
    expect(plan.get_by_text("Plan", exact=True)).to_be_visible()
    expect(plan).not_to_contain_text("does not fit")
    expect(plan.get_by_text("Refused", exact=True)).to_have_count(0)


def test_7_after_stop_the_nodes_free_memory_comes_back(stack, admin):
    page = admin.page
    idle = stack.api_state()["nodes"][0]["report"]["memory"]["budget_bytes"]
    # the registered node's row: another stack on this LAN (a second test run) may advertise a node-a too
    node_a = page.locator('#nodes li[data-node="node-a"]')
    serving = node_a.inner_text()
    page.get_by_role("button", name="Stop cluster").click()
    expect(page.locator("#cluster-health")).to_have_text("Stopped", timeout=SETTLE_MS)
    started = time.monotonic()
    wait_until(lambda: stack.api_state()["nodes"][0]["report"]["memory"]["free_bytes"] == idle, LIVE_S,
               message="node-a's report to show its memory free again")
    expect(node_a).not_to_have_text(serving, timeout=LIVE)
    print(f"\nnode-a's free memory was back {time.monotonic() - started:.2f} s after the cluster stopped")
    expect(page.get_by_role("button", name="Launch cluster")).to_be_enabled(timeout=LIVE)
