"""The Anthropic Messages translators (pure): request → chat body, chat answer → message and events.

What a real cluster answers through them is covered, with the official `anthropic` client,
in tests/router/test_protocols.py; here each mapping rule is pinned down on its own.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.engine.coordinator import anthropic_schema as an
from orchestrator.engine.coordinator.anthropic_api import MessageStream
from orchestrator.httpkit import AnthropicError, OpenAIError

TOOL = {"name": "get_weather", "description": "Weather in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def body(**fields: object) -> dict:
    return an.chat_body(an.parse(an.MessagesRequest, {"model": "m", "max_tokens": 16, **fields}))


def refusal(model: type = an.MessagesRequest, **fields: object) -> dict:
    with pytest.raises(AnthropicError) as info:
        an.chat_body(an.parse(model, {"model": "m", "max_tokens": 16, **fields}))
    assert info.value.status == 400
    return info.value.body()


def test_system_blocks_and_a_multi_turn_history_become_chat_messages():
    got = body(system=[{"type": "text", "text": "Be brief."}, {"type": "text", "text": "Be kind."}],
               messages=[{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": [{"type": "text", "text": "hel"},
                                                           {"type": "text", "text": "lo"}]},
                         {"role": "user", "content": [{"type": "text", "text": "again",
                                                       "cache_control": {"type": "ephemeral"}}]}],
               stop_sequences=["END"], temperature=0.5, top_p=0.9, top_k=7, metadata={"user_id": "u1"})
    assert got["messages"] == [{"role": "system", "content": "Be brief.\nBe kind."}, {"role": "user", "content": "hi"},
                               {"role": "assistant", "content": "hello"}, {"role": "user", "content": "again"}]
    sampling = (got["max_tokens"], got["stop"], got["temperature"], got["top_p"], got["top_k"])
    assert sampling == (16, ["END"], 0.5, 0.9, 7)
    assert got["stream"] is False and got["stream_options"] == {"include_usage": True}
    assert "metadata" not in got


def test_tool_use_and_tool_result_blocks_become_tool_calls_and_tool_messages():
    got = body(tools=[TOOL], tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
               messages=[{"role": "user", "content": "weather?"},
                         {"role": "assistant", "content": [
                             {"type": "thinking", "thinking": "hm", "signature": "x"},
                             {"type": "text", "text": "Let me look."},
                             {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                         {"role": "user", "content": [
                             {"type": "tool_result", "tool_use_id": "toolu_1",
                              "content": [{"type": "text", "text": "sunny"}]},
                             {"type": "text", "text": "and tomorrow?"}]}])
    assert got["tools"] == [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                                              "parameters": TOOL["input_schema"]}}]
    # The chat template renders a tool as JSON in the order given: OpenAI's, as an OpenAI client sends it.
    assert list(got["tools"][0]["function"]) == ["name", "description", "parameters"]
    assert got["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert got["parallel_tool_calls"] is False
    assistant, tool, user = got["messages"][1:]
    assert assistant == {"role": "assistant", "content": "Let me look.", "tool_calls": [
        {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert tool == {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"}
    assert user == {"role": "user", "content": "and tomorrow?"}


@pytest.mark.parametrize("choice, expected", [({"type": "auto"}, "auto"), ({"type": "any"}, "required"),
                                              ({"type": "none"}, "none")])
def test_tool_choice_maps_to_openai(choice, expected):
    got = body(tools=[TOOL], tool_choice=choice, messages=[{"role": "user", "content": "x"}])
    assert got["tool_choice"] == expected


def test_an_errored_tool_result_says_so_to_the_model():
    got = body(messages=[{"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]},
                         {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "boom",
                                                       "is_error": True}]}])
    assert got["messages"][-1] == {"role": "tool", "tool_call_id": "t", "content": "Error: boom"}


@pytest.mark.parametrize("fields, named", [
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "x"}}]}]},
     "messages.0.content.0: image blocks are not supported"),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "nope", "content": "x"}]}]},
     "messages.0.content.0.tool_use_id"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "web_search_20250305", "name": "ws"}]},
     "tools.0.type"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"name": "f"}]}, "tools.0.input_schema"),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [TOOL], "tool_choice": {"type": "tool", "name": "g"}},
     "tool_choice.name"),
    ({"messages": [{"role": "user", "content": "x"}], "frobnicate": 1}, "frobnicate: unknown field"),
    ({"messages": [{"role": "user", "content": "x"}], "mcp_servers": []}, "mcp_servers: not supported"),
    ({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled", "budget_tokens": 1024}},
     "thinking"),
    ({"messages": [{"role": "user", "content": "x"}], "temperature": 1.5}, "temperature"),
    ({"messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    ({"messages": []}, "messages"),
])
def test_bad_input_is_a_400_in_anthropic_shape_naming_the_field(fields, named):
    err = refusal(**fields)
    assert err["type"] == "error" and err["error"]["type"] == "invalid_request_error"
    assert named in err["error"]["message"], err


def test_max_tokens_is_required():
    with pytest.raises(AnthropicError) as info:
        an.parse(an.MessagesRequest, {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert info.value.body()["error"]["message"].startswith("max_tokens")


def test_chat_errors_name_the_anthropic_field():
    err = an.error_from_chat(OpenAIError(400, "stop: at most 4 non-empty strings", param="stop")).body()
    assert err == {"type": "error", "error": {"type": "invalid_request_error",
                                              "message": "stop_sequences: at most 4 non-empty strings"}}
    assert an.error_from_chat(OpenAIError(503, "warming up")).body()["error"]["type"] == "overloaded_error"
    bad_schema = OpenAIError(400, "response_format.json_schema.schema: not a schema", param="response_format")
    assert an.error_from_chat(bad_schema).body()["error"]["message"] == "output_config.format.schema: not a schema"


def _chat(content: str | None, finish: str, calls: list | None = None, cached: int = 0) -> dict:
    usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    msg = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
    return {"choices": [{"index": 0, "message": msg, "finish_reason": finish}], "usage": usage}


def test_a_chat_answer_becomes_a_message_with_stop_reason_and_usage():
    m = an.message(_chat("Hi", "stop"), "msg_1", "m", None)
    assert m["content"] == [{"type": "text", "text": "Hi"}] and m["stop_reason"] == "end_turn"
    assert m["usage"] == {"input_tokens": 10, "output_tokens": 3, "cache_creation_input_tokens": 0,
                          "cache_read_input_tokens": 0}
    m = an.message(_chat("Hi", "stop", cached=4), "msg_1", "m", "END")
    assert (m["stop_reason"], m["stop_sequence"]) == ("stop_sequence", "END")
    assert (m["usage"]["input_tokens"], m["usage"]["cache_read_input_tokens"]) == (6, 4)
    assert an.message(_chat("Hi", "length"), "msg_1", "m", None)["stop_reason"] == "max_tokens"
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    m = an.message(_chat(None, "tool_calls", [call]), "msg_1", "m", None)
    assert m["stop_reason"] == "tool_use"
    assert m["content"] == [{"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}]


def _chunk(content: str | None = None, calls: list | None = None, finish: str | None = None) -> dict:
    delta = {k: v for k, v in (("content", content), ("tool_calls", calls)) if v is not None}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_streamed_chunks_become_the_documented_event_sequence():
    s = MessageStream("msg_1", "m")
    events = s.start(10)
    for c in (_chunk("Hel"), _chunk("lo"),
              _chunk(calls=[{"index": 0, "id": "call_1", "type": "function",
                             "function": {"name": "get_weather", "arguments": '{"city": '}}]),
              _chunk(calls=[{"index": 0, "function": {"arguments": '"Paris"}'}}]),
              _chunk(finish="tool_calls"),
              {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}):
        events += s.chunk(c)
    events += s.done(None)
    assert [name for name, _ in events] == [
        "message_start", "ping", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "content_block_start", "content_block_delta", "content_block_delta",
        "content_block_stop", "message_delta", "message_stop"]
    assert all(data["type"] == name for name, data in events)
    assert events[0][1]["message"]["usage"]["input_tokens"] == 10
    assert events[2][1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert events[6][1]["content_block"] == {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}
    assert json.loads("".join(d["delta"]["partial_json"] for _, d in events[7:9])) == {"city": "Paris"}
    assert {d["index"] for _, d in events[6:10]} == {1}
    assert events[-2][1]["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert events[-2][1]["usage"]["output_tokens"] == 5


def test_a_thinking_models_reasoning_becomes_a_thinking_block():
    chat = _chat("Hi", "stop")
    chat["choices"][0]["message"]["reasoning"] = "Let me think."
    assert an.message(chat, "msg_1", "m", None)["content"] == [
        {"type": "thinking", "thinking": "Let me think.", "signature": ""}, {"type": "text", "text": "Hi"}]
    s = MessageStream("msg_1", "m")
    events = s.chunk({"choices": [{"index": 0, "delta": {"reasoning": "Hm"}, "finish_reason": None}]}) + \
        s.chunk(_chunk("Hi", finish="stop"))
    assert [(n, d.get("delta", d.get("content_block", {})).get("type")) for n, d in events] == [
        ("content_block_start", "thinking"), ("content_block_delta", "thinking_delta"), ("content_block_stop", None),
        ("content_block_start", "text"), ("content_block_delta", "text_delta"), ("content_block_stop", None)]


class _Recorder:
    """Stands in for the HTTP event stream (the seam the sink writes to): records named events."""

    def __init__(self) -> None:
        self.started, self.events, self.ended = False, [], False

    def send(self, obj: dict, event: str | None = None) -> None:
        self.started = True
        self.events.append((event, obj))

    def end(self) -> None:
        self.ended = True


class _Request:
    def __init__(self, prompt: list[int], stop: str | None = None) -> None:
        gen = type("Gen", (), {"prompt": prompt, "stop_sequence": stop})()
        self.context = {"generation": gen}


def test_the_sink_writes_a_failure_mid_stream_as_anthropics_error_event():
    from orchestrator.engine.coordinator.anthropic_api import MessageEvents

    rec, request = _Recorder(), _Request([1, 2, 3])
    sink = MessageEvents(rec, request, MessageStream("msg_1", "m"))
    sink.send(_chunk("Hi"))
    request.context["status"] = 503
    sink.send(OpenAIError(503, "a stage was lost", "service_unavailable").body())
    sink.send(b"[DONE]")  # (the chat path sends none after an error; were it sent, it adds nothing)
    sink.end()
    names = [n for n, _ in rec.events]
    assert names == ["message_start", "ping", "content_block_start", "content_block_delta", "error"]
    assert rec.events[0][1]["message"]["usage"]["input_tokens"] == 3
    assert rec.events[-1][1] == {"type": "error", "error": {"type": "overloaded_error", "message": "a stage was lost"}}
    assert rec.ended


def test_the_sink_reports_the_stop_sequence_that_ended_the_text():
    from orchestrator.engine.coordinator.anthropic_api import MessageEvents

    rec = _Recorder()
    sink = MessageEvents(rec, _Request([1], stop="END"), MessageStream("msg_1", "m"))
    sink.send(_chunk("Hi", finish="stop"))
    sink.send(b"[DONE]")
    assert rec.events[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
