"""The `make demo` walk (README "Two commands") in real Chromium over real processes, part 1 of
3 (e2e/dashboard/conftest.py): set up.

An admin logs in, turns distributed serving on, registers three nodes (two by address, one
through zeroconf), plans SmolLM2 over two of them and prepares it (a real copy from the only
node that has it); a viewer, whose page opens here and is never reloaded, watches it live.
Everything is found by its visible label.
"""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from e2e.pages import (
    LIVE,
    PREPARE_MS,
    SAVED_S,
    SETTLE_MS,
    add_discovered_node,
    add_nodes,
    enable_distributed_serving,
    entry,
    mark_document,
    node_entry,
    node_toggle,
    open_distributed,
    save_distributed_settings,
    select_cluster,
    submit_login,
)
from orchestrator.demo_stack import MODEL_ID
from orchestrator.proc import wait_until

pytestmark = pytest.mark.incremental(package=True)

TWO_NODES = ("node-a", "node-b")


# --- 1 ------------------------------------------------------------------------------------

def test_1_log_in_enable_distributed_serving_register_nodes(stack, admin, viewer, shots):
    page = admin.page
    page.goto(stack.url)
    expect(page).to_have_url(re.compile(r"/login"))
    shots(page, "01a-login")
    submit_login(page, "not-the-token")
    expect(page.get_by_role("alert")).to_contain_text("not valid")
    submit_login(page, stack.demo.admin_token)
    # distributed serving is off: the landing page is Models → Local, not a dead end
    expect(page.get_by_role("heading", name="Models on your nodes")).to_be_visible()
    page.get_by_role("tab", name="Distributed").click()
    expect(page.get_by_text("Distributed serving is off")).to_be_visible()
    shots(page, "01b-distributed-off")

    first, last = stack.transport
    enable_distributed_serving(page, (last, first))
    expect(page.get_by_role("alert")).to_contain_text("start must not exceed the end")
    assert stack.api_state()["settings"]["distributed_enabled"] is False  # a rejected form changes nothing
    save_distributed_settings(page, (first, last))
    settings = wait_until(lambda: (st := stack.api_state()["settings"])["distributed_enabled"] and st, SAVED_S,
                        message="the settings to be saved")
    assert (settings["port_start"], settings["port_end"]) == (first, last)
    expect(page.get_by_role("alert")).to_have_count(0)
    expect(page.get_by_label("Enable distributed serving")).to_be_checked()

    # A viewer link for step 8's second browser, which watches from now on without reloading.
    page.get_by_role("button", name="Create viewer link").click()
    link = wait_until(lambda: re.search(r"https?://[^\s\"'<]+/viewer/[\w-]+",
                                      page.locator("#new-viewer-link").inner_html()), SAVED_S, message="a viewer link")
    shots(page, "01c-settings")
    viewer.page.goto(link.group(0))
    expect(viewer.page.get_by_role("heading", name="Serve as cluster")).to_be_visible()
    expect(viewer.page.get_by_text("Viewer", exact=True)).to_be_visible()
    viewer.document = mark_document(viewer.page)

    open_distributed(page)
    add_nodes(page, stack.nodes("node-a", "node-b"))
    # node-c through discovery (zeroconf on 127.0.0.1): a hint that still needs the token.
    c = stack.node("node-c")
    add_discovered_node(page, c.name, c.address, c.token)
    for name in ("node-a", "node-b", "node-c"):
        expect(node_entry(page, name)).to_contain_text("Reachable")
        # the viewer sees every node arrive, live
        expect(node_entry(viewer.page, name)).to_contain_text("Reachable", timeout=LIVE)
    assert len(stack.api_state()["nodes"]) == 3
    shots(page, "01d-nodes")


# The widths of stage i's memory-bar segments, read in the same evaluation that finds them laid out:
# a push may re-render the card between two separate reads (one run read [0, 0, 0, 0] that way).
LAID_OUT_WIDTHS = """i => {
  const b = document.querySelectorAll('#plan-preview [role=img][aria-label^="memory fit"]')[i];
  if (!b) return null;
  const widths = [...b.children].map(c => c.getBoundingClientRect().width);
  return widths.slice(0, 3).every(w => w > 0) ? widths : null;
}"""


def laid_out_widths(page, i: int) -> list[float]:
    """Stage i's memory-bar segment widths once they are laid out (fails after SETTLE_MS)."""
    return page.wait_for_function(LAID_OUT_WIDTHS, arg=i, timeout=SETTLE_MS).json_value()


# --- 2 ------------------------------------------------------------------------------------

def test_2_select_model_and_two_nodes_preview_plan(stack, admin, viewer, shots):
    page = admin.page
    option = page.get_by_label("Model", exact=True).locator("option", has_text=MODEL_ID)
    expect(option).to_be_enabled()
    for name in ("node-a", "node-b", "node-c"):
        expect(node_toggle(page, name)).to_be_enabled()
    select_cluster(page, MODEL_ID, TWO_NODES)
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
    for i in range(2):  # weights, KV cache, overhead and prompt-cache segments, each with a width
        widths = laid_out_widths(page, i)
        assert len(widths) in (3, 4) and all(w > 0 for w in widths[:3]), widths
    kv_before = laid_out_widths(page, 0)[1]

    # the context-length control re-plans: a shorter context means a smaller KV cache (at 2048
    # tokens the model still fits on no single node; at 1024 it would, and the plan would warn)
    page.get_by_label("Context length").fill("2048")
    page.get_by_label("Context length").dispatch_event("change")
    expect(plan).to_contain_text("2048")
    wait_until(lambda: laid_out_widths(page, 0)[1] < kv_before, SAVED_S, message="the KV-cache bar to shrink")
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
    expect(row_b).to_contain_text("Present", timeout=PREPARE_MS)
    expect(row_b).to_contain_text("copied over the LAN from node-a, then verified")
    expect(row_b).not_to_contain_text("Needs download")
    expect(entry(page, "#prepare-status", "node-a")).to_contain_text("Present")
    # the seed's label, the verification its detail line (issue 38 item 5)
    expect(entry(page, "#prepare-status", "node-a")).to_contain_text("verified: the reference copy")
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
