"""The Responses API translators (pure): request → chat body, chat answer → response and events.

What a real cluster answers through them is covered, with the official `openai` client
(`client.responses.create`), in tests/router/test_protocols.py.
"""

from __future__ import annotations

import pytest

from orchestrator.engine.coordinator import responses_schema as rs
from orchestrator.engine.coordinator.responses_api import ResponseStream
from orchestrator.httpkit import OpenAIError

FN = {"type": "function", "name": "get_weather", "description": "Weather in a city",
      "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


def body(**fields: object) -> dict:
    return rs.chat_body(rs.parse({"model": "m", **fields}))


def refusal(**fields: object) -> OpenAIError:
    with pytest.raises(OpenAIError) as info:
        body(**fields)
    assert info.value.status == 400
    return info.value


def test_text_input_and_instructions_become_system_and_user_messages():
    got = body(input="hi", instructions="Be brief.", max_output_tokens=9, temperature=0.3, top_p=0.8,
               metadata={"k": "v"}, user="u", reasoning={"effort": "low"}, store=False)
    assert got == {"model": "m", "stream": False, "max_tokens": 9, "temperature": 0.3, "top_p": 0.8,
                   "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]}


def test_items_become_a_multi_turn_chat_with_tool_calls():
    got = body(tools=[FN], tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False,
               text={"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}, "strict": True}},
               input=[{"role": "user", "content": "weather?"},
                      {"type": "message", "role": "assistant",
                       "content": [{"type": "output_text", "text": "Looking."}]},
                      {"type": "reasoning", "id": "rs_1", "summary": []},
                      {"type": "function_call", "call_id": "c1", "name": "get_weather",
                       "arguments": '{"city":"Paris"}'},
                      {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city":"Rome"}'},
                      {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                      {"type": "function_call_output", "call_id": "c2",
                       "output": [{"type": "input_text", "text": "rain"}]},
                      {"role": "user", "content": [{"type": "input_text", "text": "thanks"}]}])
    assert got["tools"] == [{"type": "function", "function": {k: FN[k] for k in ("name", "description", "parameters")}}]
    assert list(got["tools"][0]["function"]) == ["name", "description", "parameters"]  # rendered in this order
    assert got["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert got["parallel_tool_calls"] is False
    assert got["response_format"] == {"type": "json_schema",
                                      "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True}}
    assert got["messages"] == [
        {"role": "user", "content": "weather?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}},
            {"id": "c2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "user", "content": "thanks"}]


@pytest.mark.parametrize("fields, param", [
    ({"input": "x", "previous_response_id": "resp_1"}, "previous_response_id"),
    ({"input": "x", "conversation": "conv_1"}, "conversation"),
    ({"input": "x", "store": True}, "store"),
    ({"input": "x", "background": True}, "background"),
    ({"input": "x", "frobnicate": 1}, "frobnicate"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "data:"}]}]}, "input.0.content.0"),
    ({"input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}, "input.0.call_id"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input.0"),
    ({"input": "x", "tools": [{"type": "web_search"}]}, "tools.0.type"),
    ({"input": "x", "tool_choice": "sometimes"}, "tool_choice"),
    ({"input": "x", "text": {"format": {"type": "yaml"}}}, "text.format.type"),
    ({"input": "x", "include": ["file_search_call.results"]}, "include"),
    ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "x", "temperature": 3}, "temperature"),
])
def test_bad_input_is_a_400_naming_the_field(fields, param):
    err = refusal(**fields)
    assert err.param == param and err.message.startswith(param), err.body()
    assert set(err.body()) == {"error"}


def test_chat_errors_name_the_responses_field():
    err = rs.error_from_chat(OpenAIError(400, "max_tokens: too many", param="max_tokens"))
    assert (err.param, err.message) == ("max_output_tokens", "max_output_tokens: too many")
    err = rs.error_from_chat(OpenAIError(400, "response_format.json_schema.schema: not a schema",
                                         param="response_format"))
    assert (err.param, err.message) == ("text.format", "text.format.schema: not a schema")
    err = rs.error_from_chat(OpenAIError(400, "This model's maximum context length is 8", param="messages"))
    assert (err.param, err.message) == ("input", "This model's maximum context length is 8")


def _chat(content: str | None, finish: str, calls: list | None = None) -> dict:
    msg = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
    return {"created": 1, "choices": [{"index": 0, "message": msg, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}}


def test_a_chat_answer_becomes_a_response():
    req = rs.parse({"model": "m", "input": "x", "max_output_tokens": 3})
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    r = rs.response(req, "resp_1", "m", 1.0, rs.output_items(_chat("Hi", "tool_calls", [call])), "tool_calls",
                    _chat("", "stop")["usage"])
    assert r["status"] == "completed" and r["object"] == "response" and r["store"] is False
    text, fn = r["output"]
    assert text["content"][0]["text"] == "Hi" and text["role"] == "assistant"
    assert (fn["type"], fn["call_id"], fn["name"], fn["arguments"]) == ("function_call", "call_1", "get_weather",
                                                                        '{"city":"Paris"}')
    assert r["usage"] == {"input_tokens": 10, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": 3,
                          "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 13}
    r = rs.response(req, "resp_1", "m", 1.0, rs.output_items(_chat("Hi", "length")), "length", None)
    assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}


def _chunk(content: str | None = None, calls: list | None = None, finish: str | None = None) -> dict:
    delta = {k: v for k, v in (("content", content), ("tool_calls", calls)) if v is not None}
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_streamed_chunks_become_the_documented_event_sequence():
    s = ResponseStream(rs.parse({"model": "m", "input": "x"}), "resp_1", "m")
    events = s.start()
    for c in (_chunk("Hel"), _chunk("lo"),
              _chunk(calls=[{"index": 0, "id": "call_1", "function": {"name": "get_weather", "arguments": '{"ci'}}]),
              _chunk(calls=[{"index": 0, "function": {"arguments": 'ty":"Paris"}'}}]),
              _chunk(finish="tool_calls"),
              {"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}):
        events += s.chunk(c)
    events += s.done()
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[6]["text"] == "Hello" and events[8]["item"]["content"][0]["text"] == "Hello"
    assert events[12]["arguments"] == '{"city":"Paris"}' and events[12]["output_index"] == 1
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]
    assert final["output"][1]["status"] == "completed" and final["usage"]["total_tokens"] == 15


def test_a_thinking_models_reasoning_becomes_a_reasoning_item():
    chat = _chat("Hi", "stop")
    chat["choices"][0]["message"]["reasoning"] = "Let me think."
    items = rs.output_items(chat)
    assert [i["type"] for i in items] == ["reasoning", "message"]
    assert items[0]["content"] == [{"type": "reasoning_text", "text": "Let me think."}]
    s = ResponseStream(rs.parse({"model": "m", "input": "x"}), "resp_1", "m")
    events = s.chunk({"choices": [{"index": 0, "delta": {"reasoning": "Hm"}, "finish_reason": None}]})
    events += s.chunk(_chunk("Hi", finish="stop"))
    assert [e["type"] for e in events] == [
        "response.output_item.added", "response.reasoning_text.delta", "response.reasoning_text.done",
        "response.output_item.done", "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done"]
    assert events[2]["text"] == "Hm" and events[7]["text"] == "Hi"


def test_the_sink_writes_a_failure_mid_stream_as_response_failed():
    from orchestrator.engine.coordinator.responses_api import ResponseEvents

    class Recorder:  # stands in for the HTTP event stream (the seam the sink writes to)
        started, events = False, []

        def send(self, obj: dict, event: str | None = None) -> None:
            self.started = True
            self.events.append((event, obj))

    rec = Recorder()
    sink = ResponseEvents(rec, ResponseStream(rs.parse({"model": "m", "input": "x"}), "resp_1", "m"))
    sink.send(_chunk("Hi"))
    sink.send(OpenAIError(503, "a stage was lost", "service_unavailable", code="stage_lost").body())
    sink.send(b"[DONE]")
    assert all(name == data["type"] for name, data in rec.events)
    last = rec.events[-1][1]
    assert last["type"] == "response.failed" and last["response"]["status"] == "failed"
    assert last["response"]["error"] == {"code": "stage_lost", "message": "a stage was lost"}
