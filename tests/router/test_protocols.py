"""Anthropic Messages and OpenAI Responses through `pipeserve router` against a real 2-stage cluster.

The official clients, unchanged: `anthropic.Anthropic` (messages.create / stream / count_tokens)
and `openai.OpenAI` (responses.create). Each answer is compared with what the same
conversation gets from /v1/chat/completions (itself compared with single-process mlx-lm in
tests/engine/coordinator/test_api.py): both APIs are translations of one chat body, so their text,
finish and usage must be the chat answer's, token for token.

The model is the tool-capable test model (testmodels/tools.py): each of its two tool-call
tokens is one whole call, so a `logit_bias` on it (a pipeserve extension both APIs pass to
the chat path) makes the random model call tools deterministically, and a presence penalty
over the last tokens then lets it end the turn.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Literal

import anthropic
import openai
import pytest
import requests
from mlx_lm.tokenizer_utils import load as load_tokenizer
from pydantic import BaseModel

from orchestrator.engine.local_pipeline import LocalPipeline
from orchestrator.proc import free_port, wait_until
from orchestrator.registrar import ConfigFileRegistrar
from orchestrator.testmodels.llama import make_test_model
from orchestrator.testmodels.tools import TOOL_CALL_TOKENS
from tests.support.router import RouterProc, write_yaml

MAX = 12  # tokens per answer: enough to compare, cheap on a loaded machine
GREEDY = {"temperature": 0}


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[LocalPipeline, RouterProc, str]]:
    """A 2-stage cluster of the tool-capable test model behind a real router process; yields
    (cluster, router, model name)."""
    root = tmp_path_factory.mktemp("protocols")
    model = make_test_model(root / "tool-model", tools=True)
    cluster = LocalPipeline(root / "cluster", model, [(0, 1), (2, 3)], threads=1).start()
    try:
        cfg = write_yaml(root / "router.yaml", {"backends": [], "health_checks": {
            "enabled": True, "interval": "0.5s", "timeout": "2s", "unhealthy_threshold": 3, "healthy_threshold": 1,
            "endpoint": "/v1/models"}})
        ConfigFileRegistrar(cfg).register("cluster", cluster.base_url, [model.name])
        router = RouterProc(cfg, free_port(), root / "router.log", 0.2).start(60)
        try:
            wait_until(lambda: any(b["routable"] for b in router.health()["backends"]), 60,
                       message="the router to see the cluster healthy")
            yield cluster, router, model.name
        finally:
            router.stop(5)
    finally:
        cluster.stop()


@pytest.fixture
def claude(served) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=served[1].url, api_key="unused", max_retries=0, timeout=60)


@pytest.fixture
def oai(served) -> openai.OpenAI:
    return openai.OpenAI(base_url=served[1].url + "/v1", api_key="unused", max_retries=0, timeout=60)


def chat(oai: openai.OpenAI, model: str, messages: list[dict], **kwargs: object):
    """The reference: the same conversation on /v1/chat/completions through the same router."""
    return oai.chat.completions.create(model=model, messages=messages, max_tokens=kwargs.pop("max_tokens", MAX),
                                       temperature=0, **kwargs)


def prompt_of(usage) -> int:
    """The whole prompt of an Anthropic answer: its input_tokens leave out what the prompt cache served."""
    return usage.input_tokens + usage.cache_read_input_tokens


HISTORY = [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
           {"role": "user", "content": "Another one?"}]


# --- Anthropic Messages ---------------------------------------------------------------

def test_a_multi_turn_message_is_the_chat_answer(claude, oai, served):
    model = served[2]
    m = claude.messages.create(model=model, max_tokens=MAX, system=[{"type": "text", "text": "Be brief."}],
                               messages=[HISTORY[0],
                                         {"role": "assistant", "content": [{"type": "text", "text": "Blue."}]},
                                         HISTORY[2]], metadata={"user_id": "u1"}, extra_body=GREEDY)
    ref = chat(oai, model, [{"role": "system", "content": "Be brief."}, *HISTORY])
    assert m.type == "message" and m.role == "assistant" and m.model == model
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == ref.choices[0].message.content
    assert m.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[ref.choices[0].finish_reason]
    assert (prompt_of(m.usage), m.usage.output_tokens) == (ref.usage.prompt_tokens, ref.usage.completion_tokens)
    assert m.usage.cache_creation_input_tokens == 0


def test_a_repeated_prompt_reads_the_prompt_cache(claude, served):
    kwargs = dict(model=served[2], max_tokens=2, system="A prompt only this test sends.", messages=HISTORY,
                  extra_body=GREEDY)
    first, again = claude.messages.create(**kwargs), claude.messages.create(**kwargs)
    assert prompt_of(first.usage) == prompt_of(again.usage)
    # The coordinator's usage.prompt_tokens_details.cached_tokens, as Anthropic reports a cache read.
    assert again.usage.cache_read_input_tokens > first.usage.cache_read_input_tokens
    assert again.usage.input_tokens < first.usage.input_tokens


def test_a_streamed_message_is_the_whole_message(claude, served):
    model = served[2]
    kwargs = dict(model=model, max_tokens=MAX, messages=HISTORY, extra_body=GREEDY)
    whole = claude.messages.create(**kwargs)
    with claude.messages.stream(**kwargs) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == whole.content[0].text == final.content[0].text
    assert final.stop_reason == whole.stop_reason and final.usage.output_tokens == whole.usage.output_tokens
    assert prompt_of(final.usage) == prompt_of(whole.usage)


def test_the_stream_is_anthropics_documented_event_sequence(served):
    _, router, model = served
    r = requests.post(router.url + "/v1/messages", json={"model": model, "max_tokens": 4, "messages": HISTORY,
                                                         "stream": True, **GREEDY}, stream=True, timeout=60)
    assert r.status_code == 200 and r.headers["Content-Type"].startswith("text/event-stream")
    events = []
    for block in r.content.decode().strip().split("\n\n"):
        name, data = block.split("\n")
        assert name.startswith("event: ") and data.startswith("data: ")
        events.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    names = [n for n, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(names[3:-3]) == {"content_block_delta"}
    assert all(d["type"] == n for n, d in events)
    assert events[-2][1]["delta"]["stop_reason"] in ("end_turn", "max_tokens")


def test_a_stop_sequence_ends_the_message_and_is_reported(claude, served):
    model = served[2]
    base = claude.messages.create(model=model, max_tokens=24, messages=HISTORY, extra_body=GREEDY).content[0].text
    stop = base[6:9]
    assert len(stop) == 3 and stop not in base[:6], base
    for streamed in (False, True):
        kwargs = dict(model=model, max_tokens=24, messages=HISTORY, stop_sequences=["\x00never", stop],
                      extra_body=GREEDY)
        if streamed:
            with claude.messages.stream(**kwargs) as s:
                m = s.get_final_message()
        else:
            m = claude.messages.create(**kwargs)
        assert m.content[0].text == base[:base.index(stop)]
        assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", stop)


def test_count_tokens_is_the_prompt_a_message_pays_for(claude, served):
    model = served[2]
    kwargs = dict(model=model, system="Be brief.", messages=HISTORY)
    counted = claude.messages.count_tokens(**kwargs).input_tokens
    assert counted == prompt_of(claude.messages.create(max_tokens=1, **kwargs).usage)
    longer = claude.messages.count_tokens(model=model, system="Be brief, always.", messages=HISTORY)
    assert counted < longer.input_tokens


@pytest.mark.parametrize("fields, status, named", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}]}]}, 400, "image"),
    ({"messages": HISTORY, "frobnicate": True}, 400, "frobnicate"),
    ({"messages": HISTORY, "temperature": 1.5}, 400, "temperature"),
    ({"messages": HISTORY, "max_tokens": 100000}, 400, "max_tokens"),
    ({"messages": HISTORY, "stop_sequences": ["a", "b", "c", "d", "e"]}, 400, "stop_sequences"),
    ({"messages": HISTORY, "model": "no-such-model"}, 404, "no-such-model"),
    ({"messages": HISTORY, "output_config": {"format": {"type": "json_schema", "schema": {"type": "nonsense"}}}},
     400, "output_config.format"),
])
def test_bad_input_is_answered_in_anthropics_shape(served, fields, status, named):
    _, router, model = served
    r = requests.post(router.url + "/v1/messages", json={"model": model, "max_tokens": MAX, **fields}, timeout=60)
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == ("not_found_error" if status == 404 else "invalid_request_error")
    assert named in body["error"]["message"]


def test_the_anthropic_client_raises_its_own_errors(claude, served):
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model=served[2], max_tokens=MAX, messages=[{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_x", "content": "42"}]}])
    assert "tool_use_id" in info.value.message
    with pytest.raises(anthropic.NotFoundError):
        claude.messages.create(model="no-such-model", max_tokens=MAX, messages=HISTORY)


# --- tool conversations ---------------------------------------------------------------

WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
TIME = {"name": "get_time", "description": "The time in a zone",
        "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def calls(served) -> dict[str, int]:
    """The tool-call tokens' ids, by the function each one calls."""
    tok = load_tokenizer(served[0].model_dir)
    out = {}
    for text in TOOL_CALL_TOKENS:
        (token,) = tok.encode(text, add_special_tokens=False)
        out[json.loads(text.removeprefix("<tool_call>").removesuffix("</tool_call>"))["name"]] = token
    out["eos"] = min(tok.eos_token_ids)
    return out


def forcing(calls: dict[str, int], *names: str) -> dict:
    """Sampling that makes the model call `names` (in order of preference), then end its turn."""
    bias = {str(calls[n]): 100.0 - 10 * i for i, n in enumerate(names)} | {str(calls["eos"]): 50.0}
    return {"temperature": 0, "logit_bias": bias, "presence_penalty": 1000.0, "presence_context_size": len(names)}


def as_chat_tools(*tools: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": t["name"], "description": t["description"],
                                              "parameters": t["input_schema"]}} for t in tools]


def test_a_tool_conversation_with_the_anthropic_client(claude, oai, served, calls):
    model = served[2]
    first = claude.messages.create(model=model, max_tokens=MAX, tools=[WEATHER, TIME], messages=ASK,
                                   extra_body=forcing(calls, "get_weather"))
    ref = oai.chat.completions.create(model=model, messages=ASK, tools=as_chat_tools(WEATHER, TIME), max_tokens=MAX,
                                      extra_body=forcing(calls, "get_weather"))
    assert first.stop_reason == "tool_use" and ref.choices[0].finish_reason == "tool_calls"
    (use,) = first.content
    (call,) = ref.choices[0].message.tool_calls
    assert (use.type, use.name, use.input) == ("tool_use", "get_weather", {"city": "Paris"})
    assert (call.function.name, json.loads(call.function.arguments)) == (use.name, use.input)
    assert (prompt_of(first.usage), first.usage.output_tokens) == (ref.usage.prompt_tokens,
                                                                   ref.usage.completion_tokens)
    counted = claude.messages.count_tokens(model=model, tools=[WEATHER, TIME], messages=ASK).input_tokens
    assert counted == prompt_of(first.usage) > claude.messages.count_tokens(model=model, messages=ASK).input_tokens
    # The tool's answer goes back as a tool_result block; the model answers in text.
    history = [*ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": [{"type": "text", "text": "Sunny, 21 C"}]}]}]
    answer = claude.messages.create(model=model, max_tokens=MAX, tools=[WEATHER, TIME], messages=history,
                                    extra_body=GREEDY)
    chat_history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": use.id, "type": "function", "function": {"name": use.name, "arguments": json.dumps(use.input)}}]},
        {"role": "tool", "tool_call_id": use.id, "content": "Sunny, 21 C"}]
    ref = chat(oai, model, chat_history, tools=as_chat_tools(WEATHER, TIME))
    assert answer.stop_reason in ("end_turn", "max_tokens")
    assert [b.type for b in answer.content] == ["text"] and answer.content[0].text == ref.choices[0].message.content
    assert prompt_of(answer.usage) == ref.usage.prompt_tokens > prompt_of(first.usage)


def test_streamed_parallel_tool_calls_with_the_anthropic_client(claude, served, calls):
    kwargs = dict(model=served[2], max_tokens=MAX, tools=[WEATHER, TIME], messages=ASK,
                  extra_body=forcing(calls, "get_weather", "get_time"))
    whole = claude.messages.create(**kwargs)
    with claude.messages.stream(**kwargs) as stream:
        kinds = [e.type for e in stream]
        final = stream.get_final_message()
    assert whole.stop_reason == final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in final.content] == [(b.name, b.input) for b in whole.content]
    assert sorted(b.name for b in final.content) == ["get_time", "get_weather"]
    assert kinds.count("content_block_start") == 2 and kinds.count("input_json") == 2


def test_a_tool_conversation_with_the_responses_api(oai, served, calls):
    model = served[2]
    tools = [{"type": "function", "name": t["name"], "description": t["description"], "parameters": t["input_schema"]}
             for t in (WEATHER, TIME)]
    first = oai.responses.create(model=model, input=ASK, tools=tools, max_output_tokens=MAX,
                                 extra_body=forcing(calls, "get_weather"))
    (item,) = first.output
    assert (item.type, item.name, json.loads(item.arguments)) == ("function_call", "get_weather", {"city": "Paris"})
    assert first.status == "completed"
    history = [*ASK, {"type": "function_call", "call_id": item.call_id, "name": item.name, "arguments": item.arguments},
               {"type": "function_call_output", "call_id": item.call_id, "output": "Sunny, 21 C"}]
    answer = oai.responses.create(model=model, input=history, tools=tools, max_output_tokens=MAX, temperature=0)
    chat_history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [
        {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}]},
        {"role": "tool", "tool_call_id": item.call_id, "content": "Sunny, 21 C"}]
    ref = chat(oai, model, chat_history, tools=as_chat_tools(WEATHER, TIME))
    assert answer.output_text == ref.choices[0].message.content
    assert answer.usage.input_tokens == ref.usage.prompt_tokens


def test_a_streamed_function_call_with_the_responses_api(oai, served, calls):
    tools = [{"type": "function", "name": WEATHER["name"], "parameters": WEATHER["input_schema"]}]
    events = list(oai.responses.create(model=served[2], input=ASK, tools=tools, max_output_tokens=MAX, stream=True,
                                       extra_body=forcing(calls, "get_weather")))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert events[2].item.type == "function_call" and events[2].item.name == "get_weather"
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert json.loads(args) == {"city": "Paris"} == json.loads(events[-3].arguments)
    (item,) = events[-1].response.output
    assert item.type == "function_call" and item.status == "completed" and item.call_id
    with oai.responses.stream(model=served[2], input=ASK, tools=tools, max_output_tokens=MAX,
                              extra_body=forcing(calls, "get_weather")) as stream:
        final = stream.get_final_response()
    (item,) = final.output
    assert (item.name, json.loads(item.arguments)) == ("get_weather", {"city": "Paris"})


def test_a_named_tool_choice_must_name_a_tool(claude, served):
    with pytest.raises(anthropic.BadRequestError) as info:
        claude.messages.create(model=served[2], max_tokens=MAX, tools=[WEATHER], messages=ASK,
                               tool_choice={"type": "tool", "name": "get_time"})
    assert "tool_choice.name" in info.value.message


# --- structured output ----------------------------------------------------------------

class Colour(BaseModel):
    """What the structured-output tests ask for: constrained decoding makes even a random model emit it."""

    colour: Literal["red", "green", "blue"]
    shade: int


def test_structured_output_with_each_clients_own_parsing(claude, oai, served):
    model = served[2]
    m = claude.messages.parse(model=model, max_tokens=40, messages=ASK, output_format=Colour, extra_body=GREEDY)
    assert isinstance(m.parsed_output, Colour) and m.stop_reason == "end_turn"
    r = oai.responses.parse(model=model, input=ASK, text_format=Colour, max_output_tokens=40, temperature=0)
    assert isinstance(r.output_parsed, Colour) and r.status == "completed"
    ref = oai.chat.completions.parse(model=model, messages=ASK, response_format=Colour, max_tokens=40, temperature=0)
    assert isinstance(ref.choices[0].message.parsed, Colour)


def test_one_schema_gives_the_same_constrained_answer_through_every_api(claude, oai, served):
    model = served[2]
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}}, "required": ["colour"],
              "additionalProperties": False}  # closed, so the random model's answer ends within the limit
    ref = oai.chat.completions.create(model=model, messages=ASK, max_tokens=40, temperature=0, response_format={
        "type": "json_schema", "json_schema": {"name": "colour", "schema": schema, "strict": True}})
    m = claude.messages.create(model=model, max_tokens=40, messages=ASK, extra_body=GREEDY,
                               output_config={"format": {"type": "json_schema", "schema": schema}})
    fmt = {"type": "json_schema", "name": "colour", "schema": schema, "strict": True}
    r = oai.responses.create(model=model, input=ASK, max_output_tokens=40, temperature=0, text={"format": fmt})
    assert m.content[0].text == r.output_text == ref.choices[0].message.content
    assert json.loads(m.content[0].text)["colour"] in ("red", "green", "blue") and m.stop_reason == "end_turn"


# --- OpenAI Responses -----------------------------------------------------------------

def test_a_text_response_is_the_chat_answer(oai, served):
    model = served[2]
    r = oai.responses.create(model=model, input="Name a colour.", instructions="Be brief.", max_output_tokens=MAX,
                             temperature=0)
    ref = chat(oai, model, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}])
    assert r.object == "response" and r.model == model
    assert r.output_text == ref.choices[0].message.content
    assert r.status == ("completed" if ref.choices[0].finish_reason == "stop" else "incomplete")
    assert (r.usage.input_tokens, r.usage.output_tokens, r.usage.total_tokens) == (
        ref.usage.prompt_tokens, ref.usage.completion_tokens, ref.usage.total_tokens)
    again = oai.responses.create(model=model, input="Name a colour.", instructions="Be brief.", max_output_tokens=MAX,
                                 temperature=0)  # the same prompt: the prompt cache serves it
    assert again.usage.input_tokens == r.usage.input_tokens and again.usage.input_tokens_details.cached_tokens > 0


def test_multi_turn_items_are_the_chat_conversation(oai, served):
    model = served[2]
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Blue."}]},
             {"role": "user", "content": "Another one?"}]
    r = oai.responses.create(model=model, input=items, max_output_tokens=MAX, temperature=0)
    assert r.output_text == chat(oai, model, HISTORY).choices[0].message.content


def test_a_streamed_response_is_the_whole_response(oai, served):
    model = served[2]
    kwargs = dict(model=model, input=HISTORY, max_output_tokens=MAX, temperature=0)
    whole = oai.responses.create(**kwargs)
    events = list(oai.responses.create(stream=True, **kwargs))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          f"response.{whole.status}"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.output_text == whole.output_text
    assert events[-1].response.usage.output_tokens == whole.usage.output_tokens
    # The SDK's accumulating helper checks each event's place; its final response needs a completed
    # one (not incomplete at the token limit), so a stop string (a pipeserve extension) ends the text.
    stop = whole.output_text[4:7]
    assert len(stop) == 3, whole.output_text
    with oai.responses.stream(**kwargs, extra_body={"stop": [stop]}) as stream:
        text = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed"
    assert text == final.output_text == whole.output_text[:whole.output_text.index(stop)]


def test_max_output_tokens_makes_an_incomplete_response(oai, served):
    r = oai.responses.create(model=served[2], input="Tell me a long story.", max_output_tokens=2, temperature=0)
    if r.usage.output_tokens == 2:  # (the model could end its answer within two tokens)
        assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"


@pytest.mark.parametrize("fields, param", [
    ({"previous_response_id": "resp_123"}, "previous_response_id"),
    ({"store": True}, "store"),
    ({"frobnicate": 1}, "frobnicate"),
    ({"max_output_tokens": 100000}, "max_output_tokens"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:image/png;base64,AA=="}]}]},
     "input.0.content.0"),
    ({"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nonsense"}}}}, "text.format"),
    ({"tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
      "tool_choice": {"type": "function", "name": "get_time"}}, "tool_choice"),
])
def test_bad_responses_input_is_a_400_naming_the_field(oai, served, fields, param):
    with pytest.raises(openai.BadRequestError) as info:
        oai.responses.create(model=served[2], input="hi", extra_body=fields)  # what the client sends as it is
    assert info.value.param == param


def test_an_unknown_model_is_a_404_in_openais_shape(oai):
    with pytest.raises(openai.NotFoundError) as info:
        oai.responses.create(model="no-such-model", input="hi")
    assert info.value.code == "model_not_found"
