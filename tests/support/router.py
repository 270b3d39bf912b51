"""A real `pipeserve router` subprocess for tests (the product's `LocalRouter`), and small
helpers around routers."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from orchestrator.router.local import LocalRouter


def write_yaml(path: Path, doc: dict) -> Path:
    """Write a router config (not atomically on purpose: tests also cover plain editors)."""
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def served_requests(base_url: str) -> int:
    """Completions a coordinator answered, from its Prometheus counter (all statuses)."""
    text = requests.get(base_url + "/metrics", timeout=5).text
    return sum(int(n) for n in re.findall(r'^pipeserve_requests_total\{endpoint="/v1/[a-z/]*completions"[^}]*\} (\d+)$',
                                          text, re.M))


def served_since(base_urls: list[str], before: list[int], total: int, timeout: float = 10.0) -> list[int]:
    """Each coordinator's completions since `before`, read once `total` of them are counted (or at
    `timeout`, for the caller's assertion to show what was): a coordinator counts a request after its
    answer is sent, so a client holding its answer may read the counter a moment before it moves."""
    deadline = time.monotonic() + timeout
    while True:
        delta = [served_requests(u) - b for u, b in zip(base_urls, before, strict=True)]
        if sum(delta) >= total or time.monotonic() > deadline:
            return delta
        time.sleep(0.05)


@dataclass(eq=False)
class RouterProc(LocalRouter):
    """A running `pipeserve router` (the product's LocalRouter) and what tests ask it."""

    def health(self) -> dict:
        return requests.get(self.url + "/health", timeout=5).json()

    def backend(self, name: str) -> dict | None:
        return next((b for b in self.health()["backends"] if b["name"] == name), None)

    def models(self) -> list[str]:
        return [m["id"] for m in requests.get(self.url + "/v1/models", timeout=5).json()["data"]]
