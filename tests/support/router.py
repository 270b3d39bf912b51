"""A real `pipeserve router` subprocess for tests (the product's `LocalRouter`), and small
helpers around routers."""

from __future__ import annotations

import re
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


@dataclass(eq=False)
class RouterProc(LocalRouter):
    """A running `pipeserve router` (the product's LocalRouter) and what tests ask it."""

    def health(self) -> dict:
        return requests.get(self.url + "/health", timeout=5).json()

    def backend(self, name: str) -> dict | None:
        return next((b for b in self.health()["backends"] if b["name"] == name), None)

    def models(self) -> list[str]:
        return [m["id"] for m in requests.get(self.url + "/v1/models", timeout=5).json()["data"]]
