"""Nothing hangs, and slowness is never a wedge (real stage and coordinator processes over TCP).

- Several clusters started at once beside CPU hogs, with the default BLAS threads (the setting
  under which stages once hung inside mlx at start): every one becomes ready.
- A stage judged wedged (its compute thread held, its readers answering) that then computes again
  brings a cluster started without a control plane back to ready on its own, answering exactly.
- A stage slowed by SIGSTOP/SIGCONT at a 50 % duty cycle beside CPU hogs keeps serving exactly and
  is never judged wedged or lost (the unit tests in coordinator/test_watchdog.py hold the rules).

No test asserts a duration: the waits are bounds with margins for a loaded machine.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import requests

from orchestrator.engine.local_pipeline import LocalPipeline
from orchestrator.proc import wait_until

BODY = {"prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0}


@contextmanager
def cpu_hogs(n: int) -> Iterator[None]:
    """`n` busy loops beside the test (a machine busy with other work), ended on exit."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]
    try:
        yield
    finally:
        for h in hogs:
            h.kill()
            h.wait()


def complete(cluster: LocalPipeline, model: str, timeout: float = 120) -> requests.Response:
    return requests.post(cluster.base_url + "/v1/completions", json={"model": model, **BODY}, timeout=timeout)


def log_text(cluster: LocalPipeline, name: str) -> str:
    return Path(cluster.procs[name].log_path).read_text(errors="replace")


def test_several_clusters_started_at_once_beside_cpu_hogs_all_become_ready(model_factory, tmp_path):
    model = model_factory(layers=12, hidden=128)
    clusters = [LocalPipeline(tmp_path / f"c{i}", model, [(0, 5), (6, 11)], threads=None, startup_timeout=300)
                for i in range(3)]
    failures: dict[int, str] = {}

    def start(i: int) -> None:
        try:
            clusters[i].start()
        except Exception as exc:  # noqa: BLE001 - every cluster's failure is reported below
            failures[i] = str(exc)

    try:
        with cpu_hogs(4):
            threads = [threading.Thread(target=start, args=(i,)) for i in range(len(clusters))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert failures == {}, failures
        answers = {complete(c, model.name).json()["choices"][0]["text"] for c in clusters}
        assert len(answers) == 1, answers  # the same model answers the same everywhere
    finally:
        for c in clusters:
            c.stop()


def test_a_stage_judged_wedged_that_computes_again_brings_the_cluster_back(test_model_dir, launch):
    """stage-1's compute thread is held for 12 s at its 16th step (after the probe and one request),
    its readers answering: judged wedged after the 2 s stall timeout, then it moves again and the
    coordinator re-probes by itself — no control plane replaces anything here — and resumes the answer
    it held."""
    cluster = launch(test_model_dir, [(0, 1), (2, 3)],
                     env={"PIPESERVE_STALL_TIMEOUT_S": "2", "PIPESERVE_CANARY_INTERVAL_S": "600",
                          "PIPESERVE_FAULTS": "stage-1:step-stall@16"})
    first = complete(cluster, test_model_dir.name)
    assert first.status_code == 200, first.text
    # held while the stage is judged wedged, resumed once it moves again: the same answer
    stalled = complete(cluster, test_model_dir.name)
    assert stalled.status_code == 200, stalled.text
    assert stalled.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]

    def ready() -> dict | None:
        h = requests.get(cluster.base_url + "/health", timeout=5).json()
        return h if h["status"] == "ready" else None

    wait_until(ready, 120, 0.2, "the cluster ready again after its stage moved")
    again = complete(cluster, test_model_dir.name)
    assert again.status_code == 200, again.text
    assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    coordinator = log_text(cluster, "coordinator")
    assert "stage.wedged" in coordinator and "stage.recovered" in coordinator and "request.resumed" in coordinator


def test_a_stage_stopped_half_the_time_beside_cpu_hogs_keeps_serving_exactly(test_model_dir, launch):
    cluster = launch(test_model_dir, [(0, 1), (2, 3)],
                     env={"PIPESERVE_STALL_TIMEOUT_S": "2", "PIPESERVE_CANARY_INTERVAL_S": "0.3"})
    expected = complete(cluster, test_model_dir.name).json()["choices"][0]["text"]
    stage = cluster.procs["stage-1"]
    done = threading.Event()

    def duty_cycle() -> None:  # 1 s stopped, 1 s running: well inside the 3 s ping timeout
        while not done.is_set():
            stage.send(signal.SIGSTOP)
            done.wait(1.0)
            stage.send(signal.SIGCONT)
            done.wait(1.0)

    toggler = threading.Thread(target=duty_cycle, daemon=True)
    answers: list[tuple[int, str]] = []
    with cpu_hogs(2):
        toggler.start()
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                r = complete(cluster, test_model_dir.name)
                answers.append((r.status_code, r.json()["choices"][0]["text"] if r.ok else r.text))
        finally:
            done.set()
            toggler.join()
            stage.send(signal.SIGCONT)
    assert answers and all(a == (200, expected) for a in answers), answers
    coordinator = log_text(cluster, "coordinator")
    assert "stage.wedged" not in coordinator and "link.down" not in coordinator, coordinator[-3000:]
    assert requests.get(cluster.base_url + "/health", timeout=5).json()["status"] == "ready"
