"""Models tab in real Chromium: from a hub repo id to a serving session, then to a cluster.

No hub is reachable, so the Hub stand-in (tests/support/hub.py) serves a test model and the
agents reach it through HF_ENDPOINT with the real huggingface_hub client. An admin registers
the nodes (one from another browser: it appears in the open download form, what was typed
there kept), lists the repo's files (nothing fetched), downloads it to one node (live
progress), serves it there (a single-node session: Sessions without the Cluster badge),
chats with it and stops it; then prepares a second repo on two other nodes (one hub
download, one LAN copy, the table naming each source) and launches a cluster from them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect

from e2e.conftest import browser_user
from e2e.pages import (
    ANSWER_MS,
    LAUNCH_MS,
    PREPARE_MS,
    ROUTER_S,
    SAVED_S,
    SETTLE_MS,
    STOPPED_S,
    add_node,
    enable_distributed_serving,
    log_in,
    nav,
    node_toggle,
)
from orchestrator.proc import wait_until
from tests.support.hub import HubStandIn, repo_from_dir

pytestmark = pytest.mark.incremental

LIVE = 20_000  # ms


@pytest.fixture(scope="module", autouse=True)
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubStandIn]:
    """The Hub stand-in, in the environment before the stack's agents start (they inherit it)."""
    from orchestrator.testmodels.llama import make_test_model

    model = make_test_model(tmp_path_factory.mktemp("hub-model") / "model", layers=4, hidden=128)
    h = HubStandIn({"org/tiny": repo_from_dir(model), "org/tiny2": repo_from_dir(model, "2")}).start()
    saved = {k: os.environ.get(k) for k in ("HF_ENDPOINT", "HF_HOME", "HF_TOKEN", "HF_HUB_DISABLE_TELEMETRY")}
    os.environ.update(HF_ENDPOINT=h.url, HF_HOME=str(tmp_path_factory.mktemp("hf-home")), HF_TOKEN="",
                      HF_HUB_DISABLE_TELEMETRY="1")
    yield h
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    h.close()






def model_row(page: Page, model: str):
    return page.locator("#local-models tr", has=page.get_by_text(model, exact=True)).first


def safetensor_gets(hub: HubStandIn, repo: str) -> int:
    return sum(1 for m, p, _ in hub.requests if m == "GET" and p.startswith(f"/{repo}/resolve/")
               and p.endswith(".safetensors"))


def test_1_log_in_and_register_three_nodes(stack, admin, shots):
    page = admin.page
    log_in(page, stack.url + "/login", stack.demo.admin_token)
    enable_distributed_serving(page, stack.transport)
    wait_until(lambda: stack.api_state()["settings"]["distributed_enabled"], SAVED_S, message="the settings saved")
    nav(page, "Models")
    page.get_by_role("tab", name="Local").click()
    page.wait_for_load_state()
    for name in ("node-a", "node-b"):
        node = stack.node(name)
        add_node(page, name, node.address, node.token)
    form = page.locator("#download-form")
    expect(node_toggle(form, "node-b")).to_be_visible(timeout=LIVE)  # registered here: offered without a reload
    shots(page, "m01-local")


def test_1b_a_node_registered_in_another_browser_appears_in_the_open_form(stack, admin, browser, shots):
    page = admin.page
    form = page.locator("#download-form")
    form.get_by_label("Hub repo id").fill("org/typed-meanwhile")  # typed, not submitted
    node_toggle(form, "node-a").check()
    with browser_user(browser) as other:  # another admin registers node-c
        log_in(other.page, stack.url + "/login", stack.demo.admin_token)
        other.page.goto(stack.url + "/models?tab=local")
        c = stack.node("node-c")
        add_node(other.page, "node-c", c.address, c.token)
    expect(node_toggle(form, "node-c")).to_be_visible(timeout=LIVE)  # no reload
    expect(form.get_by_label("Hub repo id")).to_have_value("org/typed-meanwhile")
    expect(node_toggle(form, "node-a")).to_be_checked()
    shots(page, "m01b-node-added-live")
    form.get_by_label("Hub repo id").fill("")
    node_toggle(form, "node-a").uncheck()


def test_2_list_the_hub_files_then_download_to_one_node(stack, admin, hub, shots):
    page = admin.page
    form = page.locator("#download-form")
    form.get_by_label("Hub repo id").fill("org/tiny")
    node_toggle(form, "node-b").check()
    form.get_by_role("button", name="List files").click()
    listing = page.locator("#hub-listing")
    expect(listing).to_contain_text("model.safetensors")
    expect(listing).to_contain_text("tokenizer.json")
    assert safetensor_gets(hub, "org/tiny") == 0  # listed, nothing fetched
    shots(page, "m02a-listing")
    hub.rate_bps = 1.5e6  # slow enough to watch
    listing.get_by_role("button", name=re.compile("^Download")).click()
    row = page.locator("#model-downloads tr", has_text="node-b")
    expect(row).to_contain_text("Downloading", timeout=LIVE)
    expect(row).to_contain_text(re.compile(r"\d+%"))
    expect(row).to_contain_text("left", timeout=LIVE)  # rate and time left while it runs
    shots(page, "m02b-downloading")
    hub.rate_bps = None
    expect(row).to_contain_text("Verified", timeout=SETTLE_MS)
    expect(row).to_contain_text("hub org/tiny")
    expect(model_row(page, "tiny")).to_contain_text("node-b", timeout=LIVE)
    expect(model_row(page, "tiny")).to_contain_text("Verified")
    expect(model_row(page, "tiny")).to_contain_text("Supported")
    assert (stack.node("node-b").models_dir / "tiny" / "model.safetensors").is_file()
    assert not (stack.node("node-a").models_dir / "tiny").exists()
    shots(page, "m02c-downloaded")


def test_3_serve_on_that_node_chat_and_stop(stack, admin, shots):
    page = admin.page
    holder = model_row(page, "tiny").locator("li", has_text="node-b")
    holder.get_by_role("button", name="Serve on this node").click()
    nav(page, "Sessions")
    row = page.locator("#sessions tr.session-row", has_text="tiny-single")
    expect(row).to_be_visible(timeout=LIVE)
    expect(row.get_by_text("Cluster", exact=True)).to_have_count(0)  # one node: no Cluster badge
    expect(row).to_contain_text("Healthy", timeout=LAUNCH_MS)
    wait_until(lambda: "tiny" in stack.router_models(), ROUTER_S, message="the router to list tiny")
    shots(page, "m03a-session")
    nav(page, "Chat")
    picker = page.get_by_label("Model", exact=True)
    expect(picker.locator("option", has_text="tiny")).to_be_attached(timeout=LIVE)
    picker.select_option("tiny")
    page.get_by_label("Message").fill("Hello there")
    page.get_by_role("button", name="Send").click()
    expect(page.locator("#chat-log")).to_contain_text("tokens/s", timeout=ANSWER_MS)
    shots(page, "m03b-chat")
    nav(page, "Sessions")
    row = page.locator("#sessions tr.session-row", has_text="tiny-single")
    row.get_by_role("button", name="Stop", exact=True).click()
    expect(page.locator("#sessions tr.session-row", has_text="tiny-single")).to_have_count(0, timeout=SETTLE_MS)
    wait_until(lambda: "tiny" not in stack.router_models(), ROUTER_S, message="the router to drop tiny")


def test_4_prepare_a_repo_on_two_more_nodes_one_download_then_a_lan_copy(stack, admin, hub, shots):
    page = admin.page
    nav(page, "Models")
    page.get_by_role("tab", name="Distributed").click()
    page.wait_for_load_state()
    form = page.locator("#cluster-form")
    form.get_by_label(re.compile("^Hub repo")).fill("org/tiny2")
    for name in ("node-a", "node-c"):
        node_toggle(form, name).check()
    page.get_by_role("button", name="Prepare on all nodes").click()
    prep = page.locator("#prepare-status")
    expect(prep).to_contain_text("ready to launch", timeout=PREPARE_MS)
    expect(prep.locator("tr[data-node=node-a]")).to_contain_text("downloaded from the hub org/tiny2")
    expect(prep.locator("tr[data-node=node-c]")).to_contain_text("copied over the LAN from node-a")
    assert safetensor_gets(hub, "org/tiny2") == 1  # one hub download for two nodes
    shots(page, "m04-prepared")


def test_5_launch_the_cluster_from_the_prepared_nodes(stack, admin, shots):
    page = admin.page
    form = page.locator("#cluster-form")
    expect(form.get_by_label("Model", exact=True).locator("option", has_text="tiny2")).to_be_attached(timeout=LIVE)
    form.get_by_label("Model", exact=True).select_option("tiny2")
    form.get_by_label(re.compile("^Hub repo")).fill("")
    for name in ("node-a", "node-c"):
        node_toggle(form, name).check()
    # Launch is for the selection whose shard plan is on screen: preview it first
    page.get_by_role("button", name="Preview shard plan").click()
    expect(page.locator("#plan-preview")).to_have_attribute("data-model", "tiny2")
    expect(page.get_by_role("button", name="Launch cluster")).to_be_enabled(timeout=LIVE)
    page.get_by_role("button", name="Launch cluster").click()
    monitor = page.locator("#cluster-monitor")
    expect(monitor.get_by_text("Healthy", exact=True).first).to_be_visible(timeout=LAUNCH_MS)
    wait_until(lambda: "tiny2" in stack.router_models(), ROUTER_S, message="the router to list tiny2")
    shots(page, "m05-cluster")
    page.get_by_role("button", name="Stop cluster").click()
    wait_until(lambda: not stack.api_state()["sessions"], STOPPED_S, message="the cluster to stop")
