"""Router fixtures: real `pipeserve router` processes and real coordinators, on free ports.

A fixture that cannot get its process up fails at once with that process's own output,
instead of letting a test time out on a connection error.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
import yaml

from orchestrator.engine.local import LocalPipeline, free_port

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


@pytest.fixture
def start_router(tmp_path: Path) -> Iterator[Callable[..., RouterProc]]:
    """`start_router(config_path)` runs a router until the test ends."""
    started: list[RouterProc] = []

    def start(config_path: Path, reload_interval: float = 0.2) -> RouterProc:
        port = free_port()
        log_path = tmp_path / f"router{len(started)}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli", "router", "--config", str(config_path),
                                     "--port", str(port), "--reload-interval", str(reload_interval)],
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        router = RouterProc(proc, port, log_path, config_path)
        started.append(router)
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"router exited with {proc.returncode}:\n{router.output()}")
            try:
                if requests.get(router.url + "/health", timeout=1).status_code == 200:
                    return router
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"router not up within {STARTUP_TIMEOUT:.0f} s:\n{router.output()}")
            time.sleep(0.05)

    yield start
    for r in started:
        if r.proc.poll() is None:
            r.proc.terminate()
            try:
                r.proc.wait(5)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                r.proc.wait()


@pytest.fixture(scope="session")
def coordinators(test_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[LocalPipeline]]:
    """Two independent one-stage pipelines of the same test model, both serving model "shared".

    Started in parallel (each start is mostly a child importing mlx-lm) and shared by the
    router tests, which measure traffic as differences of the coordinators' counters.
    """
    root = tmp_path_factory.mktemp("coordinators")
    pipelines = [LocalPipeline(root / f"c{i}", test_model_dir, [(0, 3)], threads=1, model_name="shared")
                 for i in range(2)]
    errors: list[BaseException] = []

    def start(p: LocalPipeline) -> None:
        try:
            p.start()
        except BaseException as exc:  # reported below, with the child's output
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(p,)) for p in pipelines]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        if errors:
            pytest.fail(f"could not start the coordinators: {errors[0]}")
        yield pipelines
    finally:
        for p in pipelines:
            p.stop()
