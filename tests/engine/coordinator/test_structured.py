"""Structured output and forced tool calls, enforced on the last stage of a real 2-stage cluster.

A random model left alone never writes JSON; constrained, every answer must parse and validate
(checked by the `openai` SDK's own `parse`, which builds the strict schema from a pydantic
model), and greedy constrained output must equal a single-process mlx-lm `generate_step`
constrained by the same library (llguidance) as a logits processor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

import mlx.core as mx
import openai
import pytest
import requests
from pydantic import BaseModel, Field

from orchestrator.engine.coordinator.openai_schema import MAX_TOOLS
from orchestrator.engine.local_pipeline import LocalPipeline
from tests.support.tool_requests import ASK, BOUNDED_TOOLS, ONE_CALL, TOOLS


class City(BaseModel):
    name: str = Field(max_length=12)
    country: Literal["FR", "IT", "DE"]
    population: int
    capital: bool


@pytest.fixture(scope="module")
def served(model_factory, tmp_path_factory):
    model = model_factory(tools=True)
    cluster = LocalPipeline(tmp_path_factory.mktemp("structured"), model, [(0, 1), (2, 3)], threads=1).start()
    yield cluster, model
    cluster.stop()


@pytest.fixture
def client(served) -> openai.OpenAI:
    cluster, _ = served
    return openai.OpenAI(base_url=cluster.base_url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _single_process_constrained(model_dir: Path, prompt: list[int], grammar: str, max_tokens: int) -> list[int]:
    """mlx-lm's own generate_step, greedy, with an llguidance mask as its logits processor."""
    import llguidance
    from mlx_lm.generate import generate_step
    from mlx_lm.tokenizer_utils import load as load_tokenizer
    from mlx_lm.utils import load_model

    model, _ = load_model(model_dir)
    eos = sorted(load_tokenizer(model_dir).eos_token_ids)
    lltok = llguidance.LLTokenizer((model_dir / "tokenizer.json").read_text(), n_vocab=512, eos_token=eos)
    matcher = llguidance.LLMatcher(lltok, grammar)
    seen = [len(prompt)]

    def constrain(tokens: mx.array, logits: mx.array) -> mx.array:
        for t in tokens.tolist()[seen[0]:]:
            assert matcher.consume_token(t)
        seen[0] = tokens.size
        bits = llguidance.LLMatcher.compute_bitmask(matcher)
        import numpy as np

        allowed = np.unpackbits(np.frombuffer(bits, dtype=np.uint8), bitorder="little")[:512].astype(bool)
        return mx.where(mx.array(allowed)[None], logits, -mx.inf)

    out = []
    for token, _ in generate_step(mx.array(prompt), model, max_tokens=max_tokens, logits_processors=[constrain]):
        out.append(int(token))
        if token in eos:
            break
    return out


def test_json_schema_parses_validates_and_equals_single_process(client, served):
    _, model = served
    r = client.chat.completions.parse(model=model.name, messages=ASK, response_format=City, max_tokens=80,
                                      temperature=0, logprobs=True)
    city = r.choices[0].message.parsed
    assert isinstance(city, City) and r.choices[0].finish_reason == "stop"
    # The same request in one process: same prompt, same grammar, mlx-lm's generate_step.
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    from orchestrator.engine.coordinator.openai_schema import ResponseFormat
    from orchestrator.engine.coordinator.structured import response_grammar

    tok = load_tokenizer(model)
    schema = openai.lib._pydantic.to_strict_json_schema(City)
    grammar = response_grammar(ResponseFormat.model_validate(
        {"type": "json_schema", "json_schema": {"name": "City", "schema": schema}}))
    prompt = list(tok.apply_chat_template(ASK, add_generation_prompt=True))
    tokens = _single_process_constrained(model, prompt, grammar, 80)
    assert tok.decode([t for t in tokens if t not in tok.eos_token_ids]) == r.choices[0].message.content
    assert r.usage.completion_tokens == len(tokens)


def test_json_schema_streamed_equals_whole(client, served):
    _, model = served
    kwargs = dict(model=model.name, messages=ASK, max_tokens=80, temperature=0,
                  response_format={"type": "json_schema", "json_schema": {
                      "name": "City", "schema": openai.lib._pydantic.to_strict_json_schema(City)}})
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kwargs)
                       if c.choices)
    assert streamed == whole and City.model_validate_json(whole)


@pytest.mark.parametrize("seed", range(4))
def test_sampled_json_always_validates(client, served, seed: int):
    _, model = served
    r = client.chat.completions.parse(model=model.name, messages=ASK, response_format=City, max_tokens=100,
                                      temperature=1.0, seed=seed)
    assert isinstance(r.choices[0].message.parsed, City)


def test_json_object_is_an_object(client, served):
    _, model = served
    r = client.chat.completions.create(model=model.name, messages=ASK, max_tokens=60, temperature=0,
                                       response_format={"type": "json_object"}, extra_body={"top_k": 8})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # a random model may write one long string: what it wrote must still be a JSON prefix of an object
        assert r.choices[0].message.content.startswith("{")


def test_required_and_named_tool_choice_give_valid_calls(client, served):
    _, model = served
    for choice, names in [("required", {"get_weather", "get_time"}),
                          ({"type": "function", "function": {"name": "get_time"}}, {"get_time"})]:
        r = client.chat.completions.create(model=model.name, messages=ASK, tools=BOUNDED_TOOLS, tool_choice=choice,
                                           parallel_tool_calls=False, max_tokens=80, temperature=0)
        calls = r.choices[0].message.tool_calls
        assert r.choices[0].finish_reason == "tool_calls" and len(calls) == 1, r
        assert calls[0].function.name in names
        arguments = json.loads(calls[0].function.arguments)
        required = next(t for t in TOOLS if t["function"]["name"] == calls[0].function.name)["function"]["parameters"]
        assert set(arguments) == set(required["required"]) and all(isinstance(v, str) for v in arguments.values())


def test_tool_choice_none_never_calls(client, served):
    _, model = served
    r = client.chat.completions.create(model=model.name, messages=ASK, tools=TOOLS, tool_choice="none",
                                       max_tokens=4, temperature=0, logit_bias=ONE_CALL["logit_bias"])
    assert r.choices[0].message.tool_calls is None and "<tool_call>" in r.choices[0].message.content


def test_a_multi_turn_tool_conversation_with_the_openai_client(client, served):
    _, model = served
    messages = list(ASK)
    first = client.chat.completions.create(model=model.name, messages=messages, tools=TOOLS, max_tokens=8,
                                           temperature=0, logit_bias=ONE_CALL["logit_bias"],
                                           presence_penalty=2.0, extra_body={"presence_penalty": 150.0,
                                                                             "presence_context_size": 2})
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and message.tool_calls[0].function.name == "get_weather"
    messages.append(message.model_dump(exclude_none=True))  # the client's own object, sent back as history
    messages.append({"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "sunny"})
    second = client.chat.completions.create(model=model.name, messages=messages, tools=TOOLS, max_tokens=8,
                                            temperature=0)
    assert second.choices[0].finish_reason in ("stop", "length") and second.choices[0].message.content
    assert second.usage.prompt_tokens > first.usage.prompt_tokens


def _tools(n: int) -> list[dict]:
    return [{"type": "function", "function": {"name": f"f{i}"}} for i in range(n)]


BAD = [
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice", "nope"),
    ({"tool_choice": "required"}, "tool_choice", "tools"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "string", "format": "no-such-format"}}}}, "response_format", "no-such-format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}}}}, "response_format", "nowhere"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
    ({"response_format": {"type": "xml"}}, "response_format.type", "json_schema"),
    ({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "tool_call_id": "c9", "content": "r"}]},
     "messages[1].tool_call_id", "c9"),
    ({"messages": [{"role": "tool", "content": "r"}]}, "messages[0].tool_call_id", "tool message"),
    ({"tools": _tools(MAX_TOOLS + 1)}, "tools", str(MAX_TOOLS)),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools", "tools[0].function.name"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:x"}}]}]},
     "messages.0.content", "text only"),
    ({"top_k": -1}, "top_k", "greater than or equal"),
    ({"min_p": 1.5}, "min_p", "less than or equal"),
    ({"repetition_penalty": -1}, "repetition_penalty", "greater than or equal"),
    ({"presence_context_size": 100000}, "presence_context_size", "less than or equal"),
    ({"xtc_probability": 2}, "xtc_probability", "less than or equal"),
    ({"logit_bias": {"9999": 1}}, "logit_bias", "9999"),
    ({"logit_bias": {"x": 1}}, "logit_bias.x.[key]", "integer"),
    ({"top_logprobs": 21, "logprobs": True}, "top_logprobs", "less than or equal"),
    ({"stop": ["s" * 1025]}, "stop", "1024 characters"),
    ({"adapters": "lora"}, "adapters", "not supported"),
    ({"draft_model": "small"}, "draft_model", "not supported"),
    ({"functions": [{"name": "f"}]}, "functions", "tools"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"id": "a", "type": "function", "function": {
        "name": "f", "arguments": "{not json"}}]}, {"role": "user", "content": "x"}]}, "messages", "JSON"),
]


@pytest.mark.parametrize("extra,param,fragment", BAD, ids=[b[1] + "-" + str(i) for i, b in enumerate(BAD)])
def test_bad_input_is_a_400_naming_the_field_and_changes_nothing(served, client, extra, param, fragment):
    cluster, model = served
    body = {"model": model.name, "messages": ASK, "max_tokens": 6, "temperature": 0, **extra}
    r = requests.post(cluster.base_url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == param and fragment in error["message"], error
    after = client.chat.completions.create(model=model.name, messages=ASK, max_tokens=6, temperature=0)
    again = client.chat.completions.create(model=model.name, messages=ASK, max_tokens=6, temperature=0)
    assert after.choices[0].message.content == again.choices[0].message.content


def test_requests_in_one_micro_batch_keep_their_own_sampling(client, served):
    """Concurrent requests with different seeds, penalties, biases and grammars decode in shared
    micro-batches; each gets exactly the answer it gets alone (its own processors, key, matcher)."""
    import threading

    _, model = served
    schema = {"type": "json_schema", "json_schema": {"name": "City",
                                                     "schema": openai.lib._pydantic.to_strict_json_schema(City)}}
    bodies = [dict(temperature=0.9, seed=1), dict(temperature=0.9, seed=2, extra_body={"top_k": 5}),
              dict(temperature=0, extra_body={"repetition_penalty": 3.0, "logit_bias": {"300": 20}}),
              dict(temperature=0, response_format=schema), dict(temperature=1.0, seed=3, response_format=schema),
              dict(temperature=0, extra_body={"presence_penalty": 5.0, "logit_bias": {"301": 25}})]

    def run(body: dict) -> str:
        r = client.chat.completions.create(model=model.name, messages=ASK, max_tokens=24, **body)
        return r.choices[0].message.content

    alone = [run(b) for b in bodies]
    together: list[str | None] = [None] * len(bodies)

    def worker(i: int) -> None:
        together[i] = run(bodies[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert together == alone
    assert len(set(alone)) == len(alone)  # six different answers: the options all mattered
