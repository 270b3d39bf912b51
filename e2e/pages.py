"""Playwright helpers the browser tests share: navigation, the dashboard's landmarks, and the
steps every walk starts with (log in, turn distributed serving on, register nodes).

Everything is found by its visible label or role, as a user finds it.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterable

import pytest
from playwright.sync_api import Locator, Page, expect

from orchestrator.agent.local_agent import LocalAgent

DISCOVERY_MS = 30_000  # zeroconf lists a node within this on a loaded machine
LIVE = 20_000  # ms: a pushed change shows up well within this, without a reload, on a loaded machine
ACTION_MS = 15_000  # a click's answer, or any expectation not named otherwise (Playwright's own: 5 s)
# How long the slow steps of a walk may take on a loaded 2-core machine (ms), named once here:
LAUNCH_MS = 180_000  # a launch (stages, coordinator probe, router) until Healthy, or a stop until Stopped
PREPARE_MS = 180_000  # a model copied to every selected node and verified ("Present", "ready to launch")
ANSWER_MS = 90_000  # a chat answer streamed back through the router
SETTLE_MS = 60_000  # a slower pushed change: a copy verified, a session gone, a refusal shown
# The same, in seconds, for `wait_until` on the control plane's or the router's own state:
SAVED_S = 10  # what the control plane does at once: a setting saved, a session recorded, a bar re-drawn
LIVE_S = LIVE / 1000  # a pushed or reported change
ROUTER_S = 30  # the router lists or drops a model (its health checks, on a loaded machine)
PROCESSES_S = 30  # every engine process ended after a stop
CANCELLED_S = 30  # the coordinator cancelled a reply its client stopped
STOPPED_S = SETTLE_MS / 1000  # a session stopped and gone
RECOVERED_S = 120  # a failed stage replaced and the session healthy again
HEALTHY_S = LAUNCH_MS / 1000  # a launch until healthy


def nav(page: Page, name: str) -> None:
    """Follow the navigation link `name` and wait for the page."""
    page.get_by_role("navigation").get_by_role("link", name=name, exact=True).click()
    page.wait_for_load_state()


def open_distributed(page: Page) -> None:
    """Models → Distributed, with the Serve as cluster form on screen."""
    nav(page, "Models")
    page.get_by_role("tab", name="Distributed").click()
    page.wait_for_load_state()
    expect(page.get_by_role("heading", name="Serve as cluster")).to_be_visible()


def node_toggle(scope: Page | Locator, name: str) -> Locator:
    """The checkbox choosing node `name` (in a form or the whole page)."""
    return scope.get_by_role("checkbox", name=re.compile(rf"^\s*{name}\b"))


def monitor(page: Page) -> Locator:
    """The cluster monitor card."""
    return page.locator("#cluster-monitor")


def badge(page: Page, text: str) -> Locator:
    """The cluster monitor's aggregate health badge reading `text`."""
    return monitor(page).get_by_text(text, exact=True).first


def cluster_rows(page: Page, model: str) -> Locator:
    """Sessions rows (table rows or list items) of `model` that carry the Cluster badge."""
    return page.locator("#sessions").locator("tr, li").filter(has=page.get_by_text("Cluster", exact=True)) \
        .filter(has_text=model)


def select_cluster(page: Page, model: str, nodes: tuple[str, ...]) -> None:
    """Choose `model` and check the given nodes' toggles in the Serve as cluster form."""
    page.get_by_label("Model", exact=True).select_option(model)
    for name in nodes:
        node_toggle(page, name).check()


def mark_document(page: Page) -> str:
    """Tag the loaded document; `same_document` proves later that it was never reloaded."""
    token = f"doc-{time.monotonic_ns()}"
    page.evaluate("t => { window.__e2eDocument = t; }", token)
    return token


def same_document(page: Page, token: str) -> None:
    """Fail unless the page still shows the document `mark_document` tagged with `token`."""
    assert page.evaluate("() => window.__e2eDocument") == token, "the page was reloaded"


def entry(page: Page, component: str, name: str) -> Locator:
    """The entry (table row or list item) for `name` in a component (e.g. "#nodes")."""
    return page.locator(component).locator("tr, li").filter(has=page.get_by_text(name, exact=True)).first


def node_entry(page: Page, name: str) -> Locator:
    """Registered node `name`'s entry in the Nodes card (not its discovery hint, which lists the
    same name until the registration lands)."""
    return page.locator(f'#nodes li[data-node="{name}"]')


# --- the steps every walk starts with ------------------------------------------------------

def submit_login(page: Page, token: str) -> None:
    """Type `token` into the login form on screen and submit it."""
    page.get_by_label("Token").fill(token)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_load_state()


def log_in(page: Page, url: str, token: str) -> None:
    """Open the dashboard at `url` (which shows the login form to a stranger) and log in."""
    page.goto(url)
    submit_login(page, token)


def save_distributed_settings(page: Page, ports: tuple[int, int] | None = None) -> None:
    """On the Settings page: check "Enable distributed serving", type the transport port range
    (first, last) when given, and Save. Whether the save was accepted is the caller's to check."""
    page.get_by_label("Enable distributed serving").check()
    if ports is not None:
        page.get_by_label("Transport port range start").fill(str(ports[0]))
        page.get_by_label("Transport port range end").fill(str(ports[1]))
    page.get_by_role("button", name="Save").click()


def enable_distributed_serving(page: Page, ports: tuple[int, int] | None = None) -> None:
    """Settings → Enable distributed serving (with that transport port range) → Save."""
    nav(page, "Settings")
    save_distributed_settings(page, ports)


def add_node(page: Page, name: str, address: str, token: str) -> None:
    """Add node `name` by its address and pairing token; wait until the Nodes card says Reachable."""
    page.get_by_label("Address", exact=True).fill(address)
    _submit_add_node(page, name, token)


def _submit_add_node(page: Page, name: str, token: str) -> None:
    """Type the token into the filled Add node form, submit it, and wait for both answers: the
    form's own (a fresh, empty form) and the live Nodes card saying Reachable. The card's push
    can come first; typing the next node before the form's answer lands would be wiped by it."""
    page.get_by_label("Pairing token", exact=True).fill(token)
    page.get_by_role("button", name="Add node").click()
    # pairing and the first report are two agent calls: seconds on a loaded machine
    expect(page.get_by_label("Address", exact=True)).to_have_value("", timeout=LIVE)
    expect(node_entry(page, name)).to_contain_text("Reachable", timeout=LIVE)


def add_nodes(page: Page, agents: Iterable[LocalAgent]) -> None:
    """`add_node` for each of these agents, in order."""
    for agent in agents:
        add_node(page, agent.name, agent.address, agent.token or "")


def add_discovered_node(page: Page, name: str, address: str, token: str, timeout_ms: float = DISCOVERY_MS) -> None:
    """Register node `name` through its discovery hint (zeroconf): its Register button fills the
    Add node form with the address; the pairing token is still typed. Fails the test when the
    hint does not appear within `timeout_ms`."""
    register = page.locator("#nodes li", has_text=address).get_by_role("button", name="Register")
    try:
        expect(register).to_be_visible(timeout=timeout_ms)
    except AssertionError:
        pytest.fail(f"discovery did not list {name} ({address}) within {timeout_ms / 1000:g} s", pytrace=False)
    register.click()
    expect(page.get_by_label("Address", exact=True)).to_have_value(address)
    _submit_add_node(page, name, token)


def prepare_and_launch(page: Page, healthy_within_ms: float) -> None:
    """Prepare on all nodes, then Launch cluster once the model is ready everywhere; wait until
    the cluster monitor's badge says Healthy."""
    page.get_by_role("button", name="Prepare on all nodes").click()
    expect(page.locator("#prepare-status")).to_contain_text("ready to launch", timeout=PREPARE_MS)
    page.get_by_role("button", name="Launch cluster").click()
    expect(badge(page, "Healthy")).to_be_visible(timeout=healthy_within_ms)
