"""One walk through the `make demo` flow, split over this package's files in the order the
flow has them: set up (log in, settings, nodes, plan, prepare), serve (launch, chat,
sessions, a killed stage), guard rails (a viewer cannot act, a failed launch leaves nothing).

The files share one stack and one browser (fixtures of package scope, overriding e2e's
module-scoped ones) and are ordered steps of one walk: after a failed step every later step
of the package is skipped (`incremental(package=True)`). Run the package as a whole:
a later file on its own lacks the state the earlier ones leave.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser

from e2e.conftest import BrowserUser, Stack, browser_user, chromium, running_stack


@pytest.fixture(scope="package")
def stack(demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The walk's one stack (e2e.conftest.running_stack)."""
    with running_stack(demo_model, tmp_path_factory.mktemp("e2e-dashboard")) as s:
        yield s


@pytest.fixture(scope="package")
def browser() -> Iterator[Browser]:
    with chromium() as b:
        yield b


@pytest.fixture(scope="package")
def admin(browser: Browser) -> Iterator[BrowserUser]:
    """The admin, logged in at step 1 and acting in every file."""
    with browser_user(browser) as u:
        yield u


@pytest.fixture(scope="package")
def viewer(browser: Browser) -> Iterator[BrowserUser]:
    """A viewer-link holder whose page, opened at step 1, only ever updates live."""
    with browser_user(browser) as u:
        yield u
