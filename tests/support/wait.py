"""Polling for tests: wait until something is true, or fail the test naming what was awaited."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05) -> object:
    """Poll until `predicate()` is truthy and return its value; fail naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
