"""Prefix-aware routing through a real `pipeserve router` in front of two real coordinators.

The coordinators are the router tests' shared pair (one-stage pipelines of the same test
model with their prompt cache on); traffic is measured as differences of their counters.
"""

from __future__ import annotations

import re
from pathlib import Path

import openai
import requests

from orchestrator.engine.local_pipeline import LocalPipeline
from orchestrator.proc import wait_until
from orchestrator.registrar import ConfigFileRegistrar
from tests.support.router import served_requests, served_since, write_yaml


def _router(tmp_path: Path, start_router, pipelines: dict[str, LocalPipeline], affinity: dict):
    cfg = write_yaml(tmp_path / "router.yaml", {
        "backends": [],
        "health_checks": {"enabled": True, "interval": "0.5s", "timeout": "2s", "healthy_threshold": 1},
        "prefix_affinity": affinity,
    })
    reg = ConfigFileRegistrar(cfg)
    for name, p in pipelines.items():
        reg.register(name, p.base_url, ["shared"])
    router = start_router(cfg)
    wait_until(lambda: {b["name"] for b in router.health()["backends"] if b["routable"]} == set(pipelines), 10,
               message="the coordinators to be healthy")
    return router, reg


def _chat(router, messages: list[dict], headers: dict | None = None):
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    return client.chat.completions.create(model="shared", messages=messages, max_tokens=6, temperature=0,
                                          extra_headers=headers or {})


def _served(pipelines: list[LocalPipeline]) -> list[int]:
    return [served_requests(p.base_url) for p in pipelines]


def _since(pipelines: list[LocalPipeline], before: list[int], total: int) -> list[int]:
    return served_since([p.base_url for p in pipelines], before, total)


def _affinity_counts(router) -> dict[str, int]:
    text = requests.get(router.url + "/metrics", timeout=5).text
    return {k: int(v) for k, v in re.findall(r'^pipeserve_router_affinity_total\{result="(\w+)"\} (\d+)$', text, re.M)}


def test_a_conversation_goes_back_to_the_backend_that_holds_its_prefix(coordinators, start_router, tmp_path):
    a, b = coordinators
    router, reg = _router(tmp_path, start_router, {"a": a, "b": b}, {"enabled": True})
    system = {"role": "system", "content": "You are a terse assistant. " * 8}
    where = []
    for i in range(4):
        first = [system, {"role": "user", "content": f"Conversation {i}: name a colour."}]
        before = _served([a, b])
        answer = _chat(router, first).choices[0].message.content
        turn2 = _chat(router, [*first, {"role": "assistant", "content": answer},
                               {"role": "user", "content": "And another one?"}])
        delta = _since([a, b], before, 2)
        assert sorted(delta) == [0, 2], f"conversation {i}: both turns on one backend, got {delta}"
        # The second turn found the first one's prefix in that backend's prompt cache.
        assert turn2.usage.prompt_tokens_details.cached_tokens > 0
        where.append(delta.index(2))
    assert where == [0, 1, 0, 1]  # new conversations are still balanced (weighted round-robin)
    assert _affinity_counts(router) == {"hit": 4, "new": 4, "moved": 0}

    # Its backend leaves the rotation: the conversation falls back to the other one and stays there.
    conv = [system, {"role": "user", "content": "Conversation 0: name a colour."}]
    reg.deregister("a")
    wait_until(lambda: router.backend("a") is None, 5, message="the router to drop backend a")
    before = _served([a, b])
    _chat(router, conv)
    _chat(router, conv)
    assert _since([a, b], before, 2) == [0, 2]
    assert _affinity_counts(router) == {"hit": 5, "new": 4, "moved": 1}


def test_an_explicit_session_header_keys_the_conversation(coordinators, start_router, tmp_path):
    a, b = coordinators
    router, _ = _router(tmp_path, start_router, {"a": a, "b": b}, {"enabled": True, "header": "X-Conversation"})
    before = _served([a, b])
    for i in range(3):  # different texts, one session: one backend
        _chat(router, [{"role": "user", "content": f"Unrelated question {i}"}], {"X-Conversation": "s-1"})
    delta = _since([a, b], before, 3)
    assert sorted(delta) == [0, 3]


def test_off_by_default_a_conversation_is_balanced(coordinators, start_router, tmp_path):
    a, b = coordinators
    router, _ = _router(tmp_path, start_router, {"a": a, "b": b}, {})
    msgs = [{"role": "user", "content": "The same conversation"}]
    before = _served([a, b])
    for _ in range(2):
        _chat(router, msgs)
    assert _since([a, b], before, 2) == [1, 1]
    assert _affinity_counts(router) == {"hit": 0, "new": 0, "moved": 0}
