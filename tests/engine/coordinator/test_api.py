"""The coordinator's OpenAI-compatible API, driven by the official `openai` client."""

from __future__ import annotations

import json
import threading

import openai
import pytest
import requests
from mlx_lm.tokenizer_utils import load as load_tokenizer

from orchestrator.engine.local_pipeline import LocalPipeline
from tests.support.engine_harness import reference


@pytest.fixture(scope="module")
def served(model_factory, tmp_path_factory):
    """One 2-stage pipeline with a coordinator process, shared by the module's tests."""
    model = model_factory()
    cluster = LocalPipeline(tmp_path_factory.mktemp("api"), model, [(0, 1), (2, 3)], threads=1).start()
    yield cluster, model
    cluster.stop()


@pytest.fixture
def client(served):
    cluster, _ = served
    return openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=30)


def test_models_lists_the_served_model(client, served):
    _, model = served
    assert [m.id for m in client.models.list().data] == [model.name]


def test_chat_completion_equals_mlx_lm_greedy(client, served):
    _, model = served
    tok = load_tokenizer(model)
    messages = [{"role": "user", "content": "The quick brown fox"}]
    prompt = list(tok.apply_chat_template(messages, add_generation_prompt=True))
    expected = reference(model, prompt, 20)
    r = client.chat.completions.create(model=model.name, messages=messages, max_tokens=20, temperature=0)
    eos = set(tok.eos_token_ids)
    n = next((i + 1 for i, t in enumerate(expected.tokens) if t in eos), len(expected.tokens))
    detok = tok.detokenizer  # the text mlx-lm itself streams for these tokens
    for t in expected.tokens[:n]:
        if t not in eos:
            detok.add_token(t)
    detok.finalize()
    assert r.choices[0].message.content == detok.text
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == n
    assert r.choices[0].finish_reason == ("stop" if n < 20 else "length")


def test_streaming_chat_matches_non_streaming(client, served):
    _, model = served
    kwargs = dict(model=model.name, messages=[{"role": "user", "content": "hello"}], max_tokens=24, temperature=0)
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("stop", "length")


def test_completions_with_logprobs_and_token_prompt(client, served):
    _, model = served
    expected = reference(model, [5, 17, 101, 33, 7], 6)
    r = client.completions.create(model=model.name, prompt=[5, 17, 101, 33, 7], max_tokens=6, temperature=0, logprobs=3)
    assert r.choices[0].logprobs.token_logprobs == expected.logprobs
    assert r.usage.completion_tokens == 6
    assert len(r.choices[0].logprobs.top_logprobs[0]) == 3


def test_stop_string_truncates_the_text(client, served):
    _, model = served
    base = client.completions.create(model=model.name, prompt="the", max_tokens=30, temperature=0).choices[0].text
    stop = base[5:8]
    assert len(stop) == 3
    r = client.completions.create(model=model.name, prompt="the", max_tokens=30, temperature=0, stop=[stop])
    assert r.choices[0].text == base[: base.find(stop)] and r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model=model.name, prompt="the", max_tokens=30, temperature=0, stop=[stop], stream=True) if c.choices)
    assert streamed == r.choices[0].text


def test_seeded_sampling_is_reproducible(client, served):
    _, model = served
    kwargs = dict(model=model.name, prompt="abc", max_tokens=16, temperature=0.9, top_p=0.9)
    a = client.completions.create(seed=42, **kwargs).choices[0].text
    b = client.completions.create(seed=42, **kwargs).choices[0].text
    c = client.completions.create(seed=7, **kwargs).choices[0].text
    assert a == b and a != c


@pytest.mark.parametrize("body,status,fragment", [
    ({"model": "nope", "messages": [{"role": "user", "content": "x"}]}, 404, "does not exist"),
    ({"messages": [{"role": "user", "content": "x"}]}, 400, "model"),
    ({"model": "{model}", "messages": []}, 400, "messages"),
    ({"model": "{model}", "messages": [{"role": "user", "content": "x"}], "temperature": 5}, 400, "temperature"),
    ({"model": "{model}", "messages": [{"role": "user", "content": "x"}], "n": 2}, 400, "n"),
    ({"model": "{model}", "messages": [{"role": "user", "content": "x " * 3000}]}, 400, "maximum context length"),
    ({"model": "{model}", "messages": [{"role": "user", "content": "x"}], "max_tokens": 100000}, 400,
     "maximum context length"),
])
def test_bad_requests_get_openai_style_errors(served, body, status, fragment):
    cluster, model = served
    body = json.loads(json.dumps(body).replace("{model}", model.name))
    r = requests.post(cluster.base_url + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == status, r.text
    assert fragment in r.json()["error"]["message"]


def test_bad_json_and_unknown_route(served):
    cluster, _ = served
    r = requests.post(cluster.base_url + "/v1/chat/completions", data=b"{not json", timeout=10,
                      headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    assert requests.get(cluster.base_url + "/v2/nothing", timeout=10).status_code == 404


def test_openai_client_raises_on_bad_request(client):
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])


def test_health_and_metrics(client, served):
    cluster, model = served
    client.completions.create(model=model.name, prompt="metrics", max_tokens=3, temperature=0)
    health = requests.get(cluster.base_url + "/health", timeout=10).json()
    assert health["status"] == "ready" and [s["id"] for s in health["stages"]] == ["stage-0", "stage-1"]
    assert all(s["state"] == "up" for s in health["stages"])
    text = requests.get(cluster.base_url + "/metrics", timeout=10).text
    for name in ("pipeserve_requests_total", "pipeserve_generated_tokens_total", "pipeserve_requests_in_flight",
                 "pipeserve_time_to_first_token_seconds_bucket", 'pipeserve_stage_step_milliseconds{stage="stage-1"}'):
        assert name in text
    generated = float(next(ln.split()[-1] for ln in text.splitlines()
                           if ln.startswith("pipeserve_generated_tokens_total")))
    assert generated >= 3


def test_concurrent_clients_all_get_their_own_answer(client, served):
    _, model = served
    prompts = ["alpha", "beta gamma", "delta", "epsilon zeta eta"]
    solo = {p: client.completions.create(model=model.name, prompt=p, max_tokens=12, temperature=0).choices[0].text
            for p in prompts}
    results: dict[str, str] = {}

    def ask(p: str) -> None:
        results[p] = client.completions.create(model=model.name, prompt=p, max_tokens=12, temperature=0).choices[0].text

    threads = [threading.Thread(target=ask, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert results == solo


def test_models_is_503_until_the_pipeline_is_ready(model_factory, tmp_path):
    """A coordinator whose stages are not running answers 503 (router: warming up)."""
    model = model_factory()
    cluster = LocalPipeline(tmp_path, model, [(0, 1), (2, 3)], threads=1)
    cluster._spawn("coordinator", ["coordinator", "--config", str(cluster.config_path), "--node-id", "coordinator",
                                   "--model", str(model), "--port", str(cluster.http_port)])
    try:
        # A list: a 503 Response is falsy, and any answer is what is awaited here.
        [r] = cluster.procs["coordinator"].wait_ready(
            lambda: [requests.get(cluster.base_url + "/v1/models", timeout=2)], "an answer on /v1/models", 30,
            interval=0.1, ignore=(requests.ConnectionError,))
        assert r.status_code == 503
        health = requests.get(cluster.base_url + "/health", timeout=2)
        assert health.status_code == 503 and health.json()["status"] == "starting"
        r = requests.post(cluster.base_url + "/v1/completions", json={"model": model.name, "prompt": "x"}, timeout=5)
        assert r.status_code == 503 and "starting" in r.json()["error"]["message"]
    finally:
        cluster.stop()


def test_a_stage_address_is_taken_only_when_signed_with_the_cluster_secret(served):
    """The control plane's POST /admin/stage-address (a stage moved): unsigned or signed with
    another secret it is refused and nothing changes; signed, it is taken (here: the same address)."""
    import time

    from orchestrator.engine.stage_address import ROUTE_PATH, SIGNATURE_HEADER, request_body, sign

    cluster, _ = served
    stage_1 = next(s["address"] for s in requests.get(cluster.base_url + "/health", timeout=10).json()["stages"]
                   if s["id"] == "stage-1")
    moved = request_body(1, "127.0.0.1:9", time.time())
    for headers in ({}, {SIGNATURE_HEADER: sign(b"not the cluster secret", moved)}):
        r = requests.post(cluster.base_url + ROUTE_PATH, data=moved, headers=headers, timeout=10)
        assert r.status_code == 403 and "signature" in r.json()["error"]["message"], r.text
    same = request_body(1, stage_1, time.time())
    r = requests.post(cluster.base_url + ROUTE_PATH, data=same, timeout=10,
                      headers={SIGNATURE_HEADER: sign(cluster.secret.encode(), same)})
    assert r.status_code == 200 and r.json() == {"stage": 1, "address": stage_1}
    health = requests.get(cluster.base_url + "/health", timeout=10).json()
    assert health["status"] == "ready" and [s["address"] for s in health["stages"]][1] == stage_1


def test_tools_on_a_model_without_tool_calling_are_refused(served, client):
    """The default test model's ChatML template has no tool calling: tools are a 400, never dropped."""
    cluster, model = served
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    body = {"model": model.name, "messages": [{"role": "user", "content": "x"}], "tools": tools, "max_tokens": 4}
    r = requests.post(cluster.base_url + "/v1/chat/completions", json=body, timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text
    assert "no tool calling" in r.json()["error"]["message"]
    # tool_choice "none" asks for no calls: served, the tools unused
    ok = client.chat.completions.create(model=model.name, messages=body["messages"], tools=tools, tool_choice="none",
                                        max_tokens=4, temperature=0)
    assert ok.choices[0].message.tool_calls is None


def test_a_replayed_stage_address_move_is_refused_even_within_the_time_window(served):
    """Issue 20, item 3: two signed moves 0.5 s apart, the first replayed 10 s later, was taken
    (200); the coordinator dialled a dead address and the cluster stayed down for 6 minutes.
    Moves are now ordered per cluster: a replay of an older one is 409 and changes nothing."""
    import time

    from orchestrator.engine.stage_address import ROUTE_PATH, SIGNATURE_HEADER, request_body, sign

    cluster, _ = served
    stage_1 = next(s["address"] for s in requests.get(cluster.base_url + "/health", timeout=10).json()["stages"]
                   if s["id"] == "stage-1")

    def post(body: bytes) -> requests.Response:
        return requests.post(cluster.base_url + ROUTE_PATH, data=body, timeout=10,
                             headers={SIGNATURE_HEADER: sign(cluster.secret.encode(), body)})

    first = request_body(1, "127.0.0.1:9", time.time())  # captured, never sent by the control plane
    second = request_body(1, stage_1, time.time() + 0.5)
    assert post(second).status_code == 200
    for replay in (first, second):
        r = post(replay)
        assert r.status_code == 409 and r.json()["error"]["code"] == "route_refused", r.text
    health = requests.get(cluster.base_url + "/health", timeout=10).json()
    assert health["status"] == "ready" and [s["address"] for s in health["stages"]][1] == stage_1
