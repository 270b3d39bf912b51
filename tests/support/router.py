"""A real `pipeserve router` subprocess for tests, and small polling helpers."""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml


STARTUP_TIMEOUT = 15.0


def wait_until(predicate: Callable[[], object], timeout: float, what: str, step: float = 0.02) -> float:
    """Poll until predicate() is truthy; returns the seconds it took, fails the test after timeout."""
    start = time.monotonic()
    while True:
        if predicate():
            return time.monotonic() - start
        if time.monotonic() - start > timeout:
            pytest.fail(f"timed out after {timeout:.1f} s waiting for {what}")
        time.sleep(step)


def write_yaml(path: Path, doc: dict) -> Path:
    """Write a router config (not atomically on purpose: tests also cover plain editors)."""
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def served_requests(base_url: str) -> int:
    """Completions a coordinator answered, from its Prometheus counter (all statuses)."""
    text = requests.get(base_url + "/metrics", timeout=5).text
    return sum(int(n) for n in re.findall(r'^pipeserve_requests_total\{endpoint="/v1/[a-z/]*completions"[^}]*\} (\d+)$',
                                          text, re.M))


@dataclass
class RouterProc:
    """A running `pipeserve router`."""

    proc: subprocess.Popen
    port: int
    log_path: Path
    config_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def health(self) -> dict:
        return requests.get(self.url + "/health", timeout=5).json()

    def backend(self, name: str) -> dict | None:
        return next((b for b in self.health()["backends"] if b["name"] == name), None)

    def models(self) -> list[str]:
        return [m["id"] for m in requests.get(self.url + "/v1/models", timeout=5).json()["data"]]


