"""A real `pipeserve router` subprocess for tests, and small helpers around routers."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from orchestrator.proc import ChildProcess, free_port

STARTUP_TIMEOUT = 15.0


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

    proc: ChildProcess
    port: int
    config_path: Path

    @classmethod
    def start(cls, config_path: Path, log_path: Path, reload_interval: float = 0.2) -> "RouterProc":
        """Start a router on a free port and wait until its /health answers (ChildError otherwise)."""
        port = free_port()
        proc = ChildProcess.spawn("router", [sys.executable, "-m", "orchestrator.cli", "router", "--config",
                                             str(config_path), "--port", str(port), "--reload-interval",
                                             str(reload_interval)], log_path)
        router = cls(proc, port, config_path)
        try:
            proc.wait_ready(lambda: requests.get(router.url + "/health", timeout=1).status_code == 200,
                            "an answer on /health", STARTUP_TIMEOUT, ignore=(requests.RequestException,))
        except BaseException:
            proc.stop()
            raise
        return router

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.proc.output(200)

    def health(self) -> dict:
        return requests.get(self.url + "/health", timeout=5).json()

    def backend(self, name: str) -> dict | None:
        return next((b for b in self.health()["backends"] if b["name"] == name), None)

    def models(self) -> list[str]:
        return [m["id"] for m in requests.get(self.url + "/v1/models", timeout=5).json()["data"]]
