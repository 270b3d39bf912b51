"""Playwright helpers the browser tests share: navigation and the dashboard's landmarks."""

from __future__ import annotations

import re

from playwright.sync_api import Locator, Page, expect


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
