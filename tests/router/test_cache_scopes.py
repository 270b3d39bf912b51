"""The prompt cache leaks nothing between callers (issue 39, item 1): the probe, through a real
`pipeserve router` in front of a real coordinator, with two API keys.

Before, client B sending client A's prompt got `cached_tokens` equal to the whole prompt (and a
faster first token), and a guess differing in one number got exactly the tokens that matched A's
prompt: an oracle over other users' prompts, token by token. Now a caller's entries are its own
(the router hands the coordinator a scope made from the caller's API key), while A's own next
turn stays warm. The same probe through a router with `cache_scope: {enabled: false}` shows the
comparison bites: there B learns A's prompt again.
"""

from __future__ import annotations

import openai
import requests

from orchestrator.cache_scope import SCOPE_HEADER, caller_scope
from orchestrator.proc import wait_until
from tests.support.router import write_yaml

SECRET = ("Patient record {n}: diagnosis is confidential; the attending physician noted a history of "
          "hypertension, two prior admissions, an allergy to penicillin and a referral to cardiology. ")


def _router(tmp_path, start_router, backend, name: str, scoped: bool):
    cfg = write_yaml(tmp_path / f"{name}.yaml", {
        "backends": [{"name": "only", "url": backend.base_url, "models": ["shared"]}],
        "health_checks": {"enabled": True, "interval": "0.5s", "timeout": "2s", "healthy_threshold": 1},
        "cache_scope": {"enabled": scoped},
    })
    router = start_router(cfg)
    wait_until(lambda: any(b["routable"] for b in router.health()["backends"]), 10,
               message="the coordinator to be healthy")
    return router


def _cached(router, key: str, text: str, headers: dict | None = None) -> tuple[int, int]:
    """(cached tokens, prompt tokens) of one chat turn sent with API key `key`."""
    client = openai.OpenAI(base_url=router.url + "/v1", api_key=key, max_retries=0, timeout=60)
    r = client.chat.completions.create(model="shared", messages=[{"role": "user", "content": text}], max_tokens=2,
                                       temperature=0, extra_headers=headers or {})
    return r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens


def test_another_callers_prompt_is_never_reused_and_the_probe_bites_without_scopes(coordinators, start_router,
                                                                                    tmp_path):
    backend = coordinators[0]
    router = _router(tmp_path, start_router, backend, "scoped", scoped=True)
    secret = SECRET.format(n=4471) * 2
    cached, prompt_tokens = _cached(router, "key-A", secret)
    assert cached == 0 and prompt_tokens > 60
    # Probes by other callers (each its own: a caller reuses its own earlier probes, rightly): A's exact
    # prompt, a guess differing in one number, and one naming A's scope in the router's own header.
    assert _cached(router, "key-B", secret)[0] == 0
    assert _cached(router, "key-C", SECRET.format(n=9999) * 2)[0] == 0
    assert _cached(router, "key-D", secret + "?", {SCOPE_HEADER: caller_scope("key-A")})[0] == 0
    # A's own next request is warm: its entries are still there, for A.
    assert _cached(router, "key-A", secret + " Summarise it.")[0] > prompt_tokens // 2

    # The same probe with scopes off: B reads A's prompt from cached_tokens again.
    open_router = _router(tmp_path, start_router, backend, "unscoped", scoped=False)
    other = SECRET.format(n=5582) * 2
    first, total = _cached(open_router, "key-A", other)
    # at most the chat template's opening, which every request of the default scope shares (other tests'
    # requests to this coordinator may have left it)
    assert first < total // 4
    leaked, total = _cached(open_router, "key-B", other)
    assert leaked > total // 2  # without scopes: B learns that A sent exactly this


def test_the_cache_salt_scopes_requests_sent_to_the_coordinator_directly(coordinators):
    """vLLM's `cache_salt`: requests with another salt (or none) reuse nothing of a salted one."""
    url = coordinators[0].base_url + "/v1/chat/completions"

    def cached(text: str, salt: object = None) -> int:
        body = {"model": "shared", "messages": [{"role": "user", "content": text}], "max_tokens": 2,
                "temperature": 0, **({"cache_salt": salt} if salt is not None else {})}
        r = requests.post(url, json=body, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    text = SECRET.format(n=6693) * 2
    assert cached(text, "team-1") == 0
    assert cached(text, "team-2") == 0 and cached(text, "team-3") == 0
    assert cached(text + " More.", "team-1") > 0
    r = requests.post(url, json={"model": "shared", "messages": [{"role": "user", "content": "x"}],
                                 "cache_salt": 7}, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text
