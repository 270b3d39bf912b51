"""`pipeserve router` in front of real coordinators, registered through the config file.

Everything here is real processes on free ports: two one-stage pipelines serving the same
model ("shared"), a third one that starts warming, and router processes reading a YAML
that `ConfigFileRegistrar` edits — the same path production uses with continuum-router.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest
import requests

from orchestrator.engine.local_pipeline import LocalPipeline
from orchestrator.proc import free_port, wait_until
from orchestrator.registrar import ConfigFileRegistrar
from tests.support.router import served_requests, served_since, write_yaml

CHAT = {"messages": [{"role": "user", "content": "Say something"}], "max_tokens": 8, "temperature": 0}


def _client(base_url: str) -> openai.OpenAI:
    # No retries: a 503 must surface as one 503, not three requests.
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=60)


def _router_with(tmp_path: Path, start_router, pipelines: dict[str, LocalPipeline], interval: str = "0.5s",
                 **health: object):
    """A router over a YAML holding other keys, with `pipelines` registered through the registrar."""
    cfg = write_yaml(tmp_path / "router.yaml", {
        "server": {"bind_address": "0.0.0.0:8080"},
        "backends": [],
        "health_checks": {"enabled": True, "interval": interval, "timeout": "2s", "unhealthy_threshold": 3,
                          "healthy_threshold": 2, "endpoint": "/v1/models", **health},
    })
    reg = ConfigFileRegistrar(cfg)
    for name, p in pipelines.items():
        reg.register(name, p.base_url, ["shared"])
    router = start_router(cfg)
    return router, reg


def _healthy(router, names: set[str]) -> bool:
    return {b["name"] for b in router.health()["backends"] if b["routable"]} == names


def _sse_events(base_url: str) -> list[dict]:
    """A streamed chat completion as parsed events, minus the per-request id and timestamp."""
    r = requests.post(base_url + "/v1/chat/completions", json={"model": "shared", "stream": True, **CHAT},
                      stream=True, timeout=60)
    assert r.status_code == 200
    events = []
    for line in r.iter_lines():
        if line.startswith(b"data: {"):
            doc = json.loads(line[6:])
            doc.pop("id"), doc.pop("created")
            events.append(doc)
        elif line:
            events.append(line.decode())
    return events


def test_two_coordinators_share_traffic_and_streams_pass_through(coordinators, start_router, tmp_path):
    a, b = coordinators
    router, _ = _router_with(tmp_path, start_router, {"a": a, "b": b})
    wait_until(lambda: _healthy(router, {"a", "b"}), 10, message="both coordinators to be healthy")
    assert router.models() == ["shared"]

    before = [served_requests(a.base_url), served_requests(b.base_url)]
    client = _client(router.url)
    texts = {client.chat.completions.create(model="shared", **CHAT).choices[0].message.content for _ in range(6)}
    assert served_since([a.base_url, b.base_url], before, 6) == [3, 3]  # equal weights: strict alternation
    assert len(texts) == 1  # same model, greedy: the same answer from either coordinator

    direct = "".join(c.choices[0].delta.content or "" for c in _client(a.base_url).chat.completions.create(
        model="shared", stream=True, **CHAT))
    routed_chunks = list(client.chat.completions.create(model="shared", stream=True, **CHAT))
    routed = "".join(c.choices[0].delta.content or "" for c in routed_chunks)
    assert routed == direct == texts.pop()
    assert routed_chunks[-1].choices[0].finish_reason == "length"
    assert _sse_events(router.url) == _sse_events(a.base_url)  # event by event, the same stream


def test_errors_from_a_coordinator_pass_through_unchanged(coordinators, start_router, tmp_path):
    a, _ = coordinators
    router, _ = _router_with(tmp_path, start_router, {"a": a})
    wait_until(lambda: _healthy(router, {"a"}), 10, message="the coordinator to be healthy")
    bad = {"model": "shared", **CHAT, "max_tokens": 0}
    direct = requests.post(a.base_url + "/v1/chat/completions", json=bad, timeout=30)
    routed = requests.post(router.url + "/v1/chat/completions", json=bad, timeout=30)
    assert direct.status_code == 400
    assert (routed.status_code, routed.content) == (direct.status_code, direct.content)


def test_a_deregistered_backend_stops_receiving_traffic(coordinators, start_router, tmp_path):
    a, b = coordinators
    interval = 0.5
    router, reg = _router_with(tmp_path, start_router, {"a": a, "b": b}, interval=f"{interval}s")
    wait_until(lambda: _healthy(router, {"a", "b"}), 10, message="both coordinators to be healthy")
    t0 = time.monotonic()
    reg.deregister("b")
    wait_until(lambda: router.backend("b") is None, 5, message="the router to drop backend b")
    print(f"backend b dropped {time.monotonic() - t0:.2f} s after its deregistration (reload interval {interval} s)")

    before = [served_requests(a.base_url), served_requests(b.base_url)]
    client = _client(router.url)
    for _ in range(4):
        client.chat.completions.create(model="shared", **CHAT)
    assert served_since([a.base_url, b.base_url], before, 4) == [4, 0]


def test_a_warming_backend_gets_no_traffic_until_ready(test_model_dir, start_router, tmp_path):
    late = LocalPipeline(tmp_path / "late", test_model_dir, [(0, 3)], threads=1, model_name="late")
    try:
        # The coordinator first, with no stage yet: it serves HTTP but answers 503 on /v1/models.
        late._spawn("coordinator", ["coordinator", "--config", str(late.config_path), "--node-id", "coordinator",
                                    "--model", str(test_model_dir), "--port", str(late.http_port),
                                    "--model-name", "late"])
        cfg = write_yaml(tmp_path / "router.yaml", {"backends": [], "health_checks": {"interval": "0.5s"}})
        router = start_router(cfg)
        ConfigFileRegistrar(cfg).register("late", late.base_url, ["late"])
        wait_until(lambda: (router.backend("late") or {}).get("state") == "warming", 15,
                   message=f"the router to see the coordinator warming:\n{late.output('coordinator')}")
        entry = router.backend("late")
        assert entry["last_status"] == 503 and not entry["routable"]
        assert router.models() == []
        with pytest.raises(openai.InternalServerError) as exc:
            _client(router.url).chat.completions.create(model="late", **CHAT)
        assert exc.value.status_code == 503
        assert "No healthy backend serves the model 'late'" in exc.value.message
        # The router's last look saw the coordinator's pipeline starting, or (issue 20) the
        # coordinator itself still starting: it answers 503 from the moment it binds.
        assert "warming" in exc.value.message and ("pipeline is starting" in exc.value.message
                                                   or "coordinator is starting" in exc.value.message)
        assert served_requests(late.base_url) == 0  # nothing was forwarded

        late._spawn("stage-0", ["stage", "--config", str(late.config_path), "--node-id", "stage-0",
                                "--model", str(test_model_dir), "--threads", "1"])
        late.wait_ready(60)
        wait_until(lambda: router.models() == ["late"], 5, message="the router to list the ready model")
        # listed once healthy: healthy_threshold (2) fresh successes since its last 503, not at the first answer
        entry = router.backend("late")
        assert entry["state"] == "healthy" and entry["routable"] and entry["last_status"] == 200, entry
        assert entry["consecutive_successes"] >= 2, entry
        reply = _client(router.url).chat.completions.create(model="late", **CHAT)
        assert reply.choices[0].message.content and served_since([late.base_url], [0], 1) == [1]
    finally:
        late.stop()


def test_unknown_model_is_404_and_no_healthy_backend_is_503(coordinators, start_router, tmp_path):
    a, _ = coordinators
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = write_yaml(tmp_path / "router.yaml", {
        "backends": [{"name": "a", "url": a.base_url, "models": ["shared"]},
                     {"name": "gone", "url": dead, "models": ["orphan"]}],
        "health_checks": {"interval": "0.2s"}})
    router = start_router(cfg)
    wait_until(lambda: (router.backend("gone") or {}).get("state") == "unhealthy", 10,
               message="the dead backend to be unhealthy")
    client = _client(router.url)
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="no-such-model", **CHAT)
    body = exc.value.body
    assert body["code"] == "model_not_found" and body["param"] == "model" and "no-such-model" in body["message"]
    with pytest.raises(openai.InternalServerError) as exc:
        client.completions.create(model="orphan", prompt="hi", max_tokens=2)
    assert exc.value.status_code == 503 and exc.value.body["code"] == "no_healthy_backend"
    assert "gone: unhealthy" in exc.value.message
    assert requests.get(router.url + "/v1/models/orphan", timeout=5).status_code == 503
    assert requests.get(router.url + "/v1/models/shared", timeout=5).json()["id"] == "shared"
    r = requests.post(router.url + "/v1/chat/completions", json={"messages": []}, timeout=5)
    assert r.status_code == 400 and r.json()["error"]["param"] == "model"


def test_connect_failures_fail_over_then_answer_503_with_retry_after(coordinators, start_router, tmp_path):
    """Never 502 for a refused connection (issue 20, item 9): the first requests after a
    coordinator was killed got 502; a refusal cannot have reached the backend, so "retry"."""
    a, _ = coordinators
    dead = [f"http://127.0.0.1:{free_port()}" for _ in range(2)]
    # Checks off, so the dead backend stays "routable" and only the proxy can notice.
    cfg = write_yaml(tmp_path / "router.yaml", {
        "backends": [{"name": "dead", "url": dead[0], "models": ["shared"]},
                     {"name": "a", "url": a.base_url, "models": ["shared"]},
                     {"name": "dead-only", "url": dead[1], "models": ["lonely"]}],
        "health_checks": {"enabled": False}})
    router = start_router(cfg)
    before = served_requests(a.base_url)
    client = _client(router.url)
    for _ in range(4):
        assert client.chat.completions.create(model="shared", **CHAT).choices[0].message.content
    assert served_since([a.base_url], [before], 4) == [4]
    metrics = requests.get(router.url + "/metrics", timeout=5).text
    assert "pipeserve_router_failovers_total 2\n" in metrics  # every other pick was the dead one
    with pytest.raises(openai.APIStatusError) as exc:
        client.chat.completions.create(model="lonely", **CHAT)
    assert exc.value.status_code == 503 and "Could not connect to any backend serving 'lonely'" in exc.value.message
    assert exc.value.response.headers.get("Retry-After") == "1"


def test_hot_reload_applies_valid_changes_and_keeps_the_old_config_on_invalid_ones(coordinators, start_router,
                                                                                 tmp_path):
    a, b = coordinators
    router, reg = _router_with(tmp_path, start_router, {"a": a}, interval="0.2s")
    wait_until(lambda: _healthy(router, {"a"}), 10, message="backend a to be healthy")
    cfg = router.config_path
    good = cfg.read_text()

    cfg.write_text(good + "backends: [ {name: broken\n")  # a half-edited file
    wait_until(lambda: router.health()["config"]["error"], 5, message="the router to report the invalid file")
    assert "not valid YAML" in router.health()["config"]["error"]
    assert [x["name"] for x in router.health()["backends"]] == ["a"]
    assert _client(router.url).chat.completions.create(model="shared", **CHAT).choices[0].message.content
    assert "config.invalid" in router.output() and "kept='previous configuration'" in router.output()

    cfg.write_text(good.replace("unhealthy_threshold: 3", "unhealthy_threshold: zero"))  # valid YAML, bad value
    wait_until(lambda: "unhealthy_threshold" in (router.health()["config"]["error"] or ""), 5,
               message="the router to reject the bad value")
    assert router.health()["health_checks"]["unhealthy_threshold"] == 3

    cfg.write_text(good)
    reg.register("b", b.base_url, ["shared"])
    wait_until(lambda: _healthy(router, {"a", "b"}), 10, message="backend b to join after the fix")
    assert router.health()["config"]["error"] is None


def test_an_invalid_file_at_start_is_refused_with_the_reason(tmp_path):
    cfg = write_yaml(tmp_path / "router.yaml", {"backends": [{"name": "a"}]})
    done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "router", "--config", str(cfg), "--port",
                           str(free_port())], capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "config.invalid" in done.stderr and "backends.0.url" in done.stderr


@pytest.mark.parametrize("env, status, event", [
    ({}, 3, "http.bind_failed"),  # the port is taken
    ({"PIPESERVE_HTTP_MAX_CONNECTIONS": "none"}, 2, "PIPESERVE_HTTP_MAX_CONNECTIONS='none'"),  # named at start
])
def test_a_port_it_cannot_bind_or_a_bad_http_setting_ends_it_with_its_status(tmp_path, env, status, event):
    """The router's and the coordinator's one rule (httpkit.server.bound): exit 2 for a bad
    PIPESERVE_HTTP_* setting, 3 for an address that cannot be bound; logged either way."""
    import os
    import socket

    cfg = write_yaml(tmp_path / "router.yaml", {"backends": []})
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1] if not env else free_port()
        done = subprocess.run([sys.executable, "-m", "orchestrator.cli", "router", "--config", str(cfg), "--port",
                               str(port)], capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert done.returncode == status, done.stderr
    assert event in done.stderr and "Traceback" not in done.stderr
