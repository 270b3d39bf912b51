"""Losing a stage: in-flight requests fail fast and loudly, health names the stage, no hangs.

Also: a stage holds only its own layers in memory.
"""

from __future__ import annotations

import json
import signal
import threading
import time

import pytest
import requests

from orchestrator.proc import WaitTimeout, wait_until
from tests.support.engine_harness import InTestCoordinator


def _stream_until_failure(url: str, body: dict, first_chunk: threading.Event, result: dict) -> None:
    """Read an SSE stream; record when it ended and whether it carried an error event."""
    with requests.post(url, json=body, stream=True, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith(b"data: "):
                continue
            first_chunk.set()
            data = line[6:]
            if data == b"[DONE]":
                break
            event = json.loads(data)
            if "error" in event:
                result["error"] = event["error"]["message"]
    result["ended"] = time.monotonic()


@pytest.fixture
def slow_model(model_factory):
    """Wide enough that a long generation takes several seconds."""
    return model_factory(layers=4, hidden=256, heads=4, kv_heads=4, vocab=512)


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_losing_a_stage_fails_in_flight_requests_quickly(slow_model, launch, how):
    """With holding off (a resume deadline of 0), answers in flight fail at once when a stage is lost;
    with it on they pause and resume once it is replaced (test_resume.py)."""
    cluster = launch(slow_model, [(0, 1), (2, 3)], env={"PIPESERVE_RESUME_DEADLINE_S": "0"}, context_length=16384)
    url = cluster.base_url + "/v1/completions"
    body = {"model": slow_model.name, "prompt": "hello", "max_tokens": 16000, "temperature": 0}
    first, result, blocking = threading.Event(), {}, {}
    streamer = threading.Thread(target=_stream_until_failure, args=(url, {**body, "stream": True}, first, result))
    streamer.start()

    def non_streaming() -> None:
        r = requests.post(url, json=body, timeout=60)
        blocking.update(status=r.status_code, body=r.json(), ended=time.monotonic())

    other = threading.Thread(target=non_streaming)
    other.start()
    assert first.wait(30), cluster.output("coordinator")
    wait_until(lambda: _health(cluster)["in_flight"] == 2, 30, 0.02, "both requests in flight")
    cluster.kill("stage-1", signal.SIGKILL if how == "killed" else signal.SIGSTOP)
    try:
        streamer.join(10)
        other.join(10)
        assert "stage-1" in result.get("error", ""), result
        assert blocking.get("status", 0) >= 500 and "stage-1" in blocking["body"]["error"]["message"]
        # how it was lost, not the requests' own 60 s timeout: a killed stage's socket closes at
        # once; a hung one is declared lost after PING_TIMEOUT of silence
        silent = "no answer for"  # the silence verdict (coordinator liveness)
        assert (silent in result["error"]) == (how == "stopped"), result
        assert (silent in blocking["body"]["error"]["message"]) == (how == "stopped"), blocking
        health = requests.get(cluster.base_url + "/health", timeout=5)
        assert health.status_code == 503
        stages = {s["id"]: s["state"] for s in health.json()["stages"]}
        assert health.json()["status"] == "unhealthy" and "stage-1" in health.json()["reason"]
        if how == "killed":
            assert stages["stage-1"] == "down"
        assert requests.get(cluster.base_url + "/v1/models", timeout=5).status_code == 503
        r = requests.post(url, json={**body, "max_tokens": 3}, timeout=5)
        assert r.status_code == 503
    finally:
        if how == "stopped":
            cluster.kill("stage-1", signal.SIGCONT)


def test_pipeline_recovers_when_the_stage_comes_back(model_factory, launch):
    model = model_factory()
    cluster = launch(model, [(0, 1), (2, 3)])
    body = {"model": model.name, "prompt": [5, 6, 7], "max_tokens": 8, "temperature": 0}
    before = requests.post(cluster.base_url + "/v1/completions", json=body, timeout=30).json()["choices"][0]["text"]
    cluster.kill("stage-1")
    assert cluster.procs["stage-1"].wait_exit(10)
    wait_until(lambda: requests.get(cluster.base_url + "/health", timeout=5).json()["status"] == "unhealthy", 10,
               message="the coordinator to notice the lost stage")
    cluster._spawn("stage-1", ["stage", "--config", str(cluster.config_path), "--node-id", "stage-1",
                               "--model", str(model)])
    cluster.wait_ready(60)
    after = requests.post(cluster.base_url + "/v1/completions", json=body, timeout=30).json()["choices"][0]["text"]
    assert after == before


def test_a_health_long_poll_answers_as_soon_as_a_stage_is_lost(model_factory, launch):
    """`/health?wait=S&unless=ready` waits while ready and answers when the state changes:
    the control plane's watcher hears of a lost stage when the coordinator does."""
    cluster = launch(model_factory(), [(0, 1), (2, 3)])
    got: dict = {}

    def long_poll() -> None:
        r = requests.get(cluster.base_url + "/health", params={"wait": 10, "unless": "ready"}, timeout=30)
        got.update(r.json())

    poll = threading.Thread(target=long_poll, daemon=True)
    poll.start()
    poll.join(1.0)
    assert poll.is_alive(), f"answered while still ready: {got}"  # it waits, it does not poll
    cluster.kill("stage-1")
    poll.join(20)
    assert not poll.is_alive()
    # answered with the change: the lost stage, named
    assert got["status"] != "ready" and got["stages"][1]["state"] == "down", got
    plain = requests.get(cluster.base_url + "/health", params={"wait": "soon", "unless": "unhealthy"}, timeout=5)
    assert plain.json()["status"] == got["status"]  # a malformed wait answers at once


def test_a_replaced_stage_that_computes_differently_fails_the_probe(model_factory, launch):
    """After the first probe passed, a re-probe must sample the same first token: a stage
    started from other weights (same shapes) is never ready again."""
    model, other = model_factory(), model_factory(seed=1)
    cluster = launch(model, [(0, 1), (2, 3)])
    cluster.kill("stage-1")
    assert cluster.procs["stage-1"].wait_exit(10)
    cluster._spawn("stage-1", ["stage", "--config", str(cluster.config_path), "--node-id", "stage-1",
                               "--model", str(other)])
    health = _wait_health(cluster, lambda h: "computes differently" in str(h.get("reason")), 60)
    assert health["status"] == "unhealthy" and "probe generation failed" in health["reason"], health
    cluster.kill("stage-1")  # and the right weights pass again
    assert cluster.procs["stage-1"].wait_exit(10)
    cluster._spawn("stage-1", ["stage", "--config", str(cluster.config_path), "--node-id", "stage-1",
                               "--model", str(model)])
    cluster.wait_ready(60)


def test_the_coordinator_probes_its_stages_while_its_tokenizer_loads(model_factory, launch):
    """The links and the probe do not wait for the tokenizer stack's import (~1 s): the pipeline
    starts before it is loaded (a replaced coordinator is ready sooner; whether its links are up
    before the import ends depends on the machine's load); end-of-sequence ids are set before the
    server takes requests (test_api's greedy runs stop at them). Its port is bound first, so no
    other process can take it meanwhile (a CI run lost a coordinator that way)."""
    model = model_factory()
    cluster = launch(model, [(0, 1), (2, 3)])
    lines = cluster.output("coordinator", tail=200).splitlines()
    first = {event: next(i for i, line in enumerate(lines) if f" {event} " in line)
             for event in ("http.bound", "pipeline.started", "link.up", "tokenizer.loaded", "http.listening")}
    # (link.up is only required to appear: the links' threads may log it before this thread logs pipeline.started)
    assert first["http.bound"] < first["pipeline.started"] < first["tokenizer.loaded"] < first["http.listening"], lines
    body = {"model": model.name, "prompt": [5, 6, 7], "max_tokens": 4, "temperature": 0}
    assert requests.post(cluster.base_url + "/v1/completions", json=body, timeout=30).status_code == 200


def test_a_stage_holds_only_its_own_layers(model_factory, launch):
    model = model_factory(layers=8, hidden=512, heads=8, kv_heads=8, intermediate=1408)
    model_bytes = sum(p.stat().st_size for p in model.glob("*.safetensors"))
    cluster = launch(model, [(0, 0), (1, 7)], coordinator=False)
    coord = InTestCoordinator(cluster)
    try:
        coord.wait_ready()
        small, big = coord.stage_stats(lambda st: all("rss_bytes" in s for s in st))
    finally:
        coord.stop()
    assert small["weight_bytes"] < 0.2 * model_bytes
    assert big["weight_bytes"] > 0.8 * model_bytes
    # One eighth of the layers: resident memory far below the stage that holds the rest.
    assert small["rss_bytes"] + 0.5 * model_bytes < big["rss_bytes"], (small, big, model_bytes)


def test_a_stage_that_loads_but_cannot_serve_is_never_ready(test_model_dir, launch):
    """Ready means serving: the probe runs a request's paths, so a stage whose every step fails
    keeps /v1/models at 503, with its error in /health."""
    from orchestrator.engine.local_pipeline import LaunchError

    with pytest.raises(LaunchError) as failure:
        launch(test_model_dir, [(0, 1), (2, 3)], env={"PIPESERVE_FAULTS": "stage-1:step-error"}, startup_timeout=60)
    message = str(failure.value)
    assert "'status': 'unhealthy'" in message and "probe generation failed" in message, message
    assert "stage-1" in message and "cannot compute" in message, message



# a stage that wedges for good: nothing to resume on (answers held across a wedge: test_liveness.py)
WEDGE_ENV = {"PIPESERVE_STALL_TIMEOUT_S": "2", "PIPESERVE_CANARY_INTERVAL_S": "1", "PIPESERVE_RESUME_DEADLINE_S": "0"}


def _health(cluster) -> dict:
    return requests.get(cluster.base_url + "/health", timeout=5).json()


def _wait_health(cluster, predicate, timeout: float = 30.0) -> dict:
    last: dict = {}

    def matching() -> dict | None:
        last.update(_health(cluster))
        return dict(last) if predicate(last) else None

    try:
        return wait_until(matching, timeout, 0.1, "a /health document that matches")
    except WaitTimeout as exc:
        raise AssertionError(f"{exc}: {last}") from None


def test_a_wedged_stage_fails_requests_and_is_named_with_its_progress(test_model_dir, launch):
    """step-hang from stage-1's 20th step on: the probe passes, a long request wedges it; its
    readers still answer pings, the watchdog sees one step last past the stall timeout."""
    cluster = launch(test_model_dir, [(0, 1), (2, 3)],
                     env={**WEDGE_ENV, "PIPESERVE_FAULTS": "stage-1:step-hang@20",
                          "PIPESERVE_CANARY_INTERVAL_S": "600"})
    body = {"model": test_model_dir.name, "prompt": [5, 6, 7], "max_tokens": 200, "temperature": 0}
    started = time.monotonic()
    r = requests.post(cluster.base_url + "/v1/completions", json=body, timeout=60)
    failed_after = time.monotonic() - started
    assert r.status_code >= 500 and "wedged" in r.json()["error"]["message"], r.text
    assert "stage-1" in r.json()["error"]["message"]
    h = _health(cluster)
    stage1 = next(s for s in h["stages"] if s["id"] == "stage-1")
    assert h["status"] == "unhealthy" and "wedged" in h["reason"], h
    assert stage1["state"] == "wedged" and "inside one step" in stage1["fault"], stage1
    # busy_s is the last PONG's, read a moment before the verdict
    assert stage1["progress"]["busy_s"] > 1 and stage1["progress"]["request"] is not None, stage1
    assert next(s for s in h["stages"] if s["id"] == "stage-0")["state"] == "up"
    r = requests.post(cluster.base_url + "/v1/completions", json=body, timeout=10)
    assert r.status_code == 503 and r.headers.get("Retry-After"), r.headers
    print(f"wedged stage: request failed after {failed_after:.2f} s (stall timeout 2 s)")


def test_an_idle_pipeline_sends_canaries_that_find_a_wedged_stage(test_model_dir, launch):
    """No request at all: the idle canary makes the stage step, and the watchdog catches the hang."""
    cluster = launch(test_model_dir, [(0, 1), (2, 3)], env={**WEDGE_ENV, "PIPESERVE_FAULTS": "stage-1:step-hang@12"})
    h = _wait_health(cluster, lambda h: h["status"] == "unhealthy", 60)
    assert "stage-1" in h["reason"] and "wedged" in h["reason"], h


def test_stage_progress_is_reported_in_health(test_model_dir, launch):
    cluster = launch(test_model_dir, [(0, 1), (2, 3)], env=WEDGE_ENV)
    # Every stage reports progress (None until its first PONG); once ready, each has stepped
    h = _wait_health(cluster, lambda h: all((s.get("progress") or {}).get("steps", 0) > 0 for s in h["stages"]))
    for s in h["stages"]:
        p = s["progress"]
        assert p["steps"] > 0 and p["busy_s"] >= 0 and p["queued"] >= 0 and p["pid"] > 0, p
    before = h["stages"][1]["progress"]["steps"]
    # the idle canary keeps the stages stepping (and the pipeline ready)
    h = _wait_health(cluster, lambda h: h["stages"][1]["progress"]["steps"] > before, 30)
    assert h["status"] == "ready", h
