"""POST /v1/responses: OpenAI's Responses API over the chat path.

A thin handler: the body becomes the coordinator's OpenAI chat body (`responses_schema`),
runs through the same code as /v1/chat/completions, and the answer becomes a `response`
object. Streamed, the chat chunks arrive in `ResponseEvents`, which writes the documented
events, each with its `sequence_number`: response.created, response.in_progress; per output
item response.output_item.added, then for text response.content_part.added,
response.output_text.delta..., response.output_text.done, response.content_part.done, for a
function call response.function_call_arguments.delta... / .done, for a thinking model's
reasoning response.reasoning_text.delta... / .done; response.output_item.done;
finally response.completed (or response.incomplete at max_output_tokens, response.failed on
an error mid-stream).
"""

from __future__ import annotations

import time
from typing import Any

from orchestrator.engine.coordinator import responses_schema as rs
from orchestrator.engine.coordinator.anthropic_api import ChatRunner
from orchestrator.httpkit import EventStream, OpenAIError, Request, Route, route

PATHS = ("/v1/responses",)


class ResponseStream:
    """OpenAI chat chunks → Responses stream events (pure: events are returned, not written)."""

    def __init__(self, req: rs.ResponsesRequest, rid: str, model: str) -> None:
        self.req = req
        self.rid = rid
        self.model = model
        self.created = time.time()
        self.seq = 0
        self.items: list[dict] = []  # output items, finished or open
        self.open: dict | None = None  # the item being streamed
        self.text = ""
        self.tool_items: dict[int, dict] = {}  # OpenAI tool_call index → its function_call item
        self.finish: str | None = None
        self.usage: dict | None = None

    def _event(self, kind: str, **fields: Any) -> dict:
        event = {"type": kind, "sequence_number": self.seq, **fields}
        self.seq += 1
        return event

    def _response(self, status: str | None = None, output: list[dict] | None = None) -> dict:
        done = status is not None and status != "in_progress"
        return rs.response(self.req, self.rid, self.model, self.created, self.items if output is None else output,
                           self.finish if done else None, self.usage if done else None, status)

    def start(self) -> list[dict]:
        """response.created and response.in_progress."""
        return [self._event("response.created", response=self._response("in_progress", [])),
                self._event("response.in_progress", response=self._response("in_progress", []))]

    def _close(self) -> list[dict]:
        item, self.open = self.open, None
        if item is None:
            return []
        index = self.items.index(item)
        events = []
        if item["type"] == "reasoning":
            events.append(self._event("response.reasoning_text.done", item_id=item["id"], output_index=index,
                                      content_index=0, text=self.text))
            item.update(rs.reasoning_item(item["id"], self.text))
        elif item["type"] == "message":
            part = {"type": "output_text", "text": self.text, "annotations": [], "logprobs": []}
            ids = {"item_id": item["id"], "output_index": index, "content_index": 0}
            events += [self._event("response.output_text.done", **ids, text=self.text, logprobs=[]),
                       self._event("response.content_part.done", **ids, part=part)]
            item.update(rs.text_item(item["id"], self.text))
        else:
            events.append(self._event("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                                      name=item["name"], arguments=item["arguments"]))
            item["status"] = "completed"
        events.append(self._event("response.output_item.done", output_index=index, item=dict(item)))
        return events

    def _add(self, item: dict) -> list[dict]:
        events = self._close()
        self.items.append(item)
        self.open = item
        return events + [self._event("response.output_item.added", output_index=len(self.items) - 1, item=dict(item))]

    def chunk(self, chunk: dict) -> list[dict]:
        """The events one chat.completion.chunk makes."""
        events: list[dict] = []
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning"):
                events += self._reasoning_delta(delta["reasoning"])
            if delta.get("content"):
                events += self._text_delta(delta["content"])
            for call in delta.get("tool_calls") or []:
                events += self._call_delta(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
                events += self._close()
        return events

    def _text_delta(self, text: str) -> list[dict]:
        events: list[dict] = []
        if self.open is None or self.open["type"] != "message":
            events += self._add(rs.text_item(rs.new_id("msg"), "", status="in_progress"))
            self.text = ""
            ids = {"item_id": self.open["id"], "output_index": len(self.items) - 1, "content_index": 0}  # type: ignore[index]
            events.append(self._event("response.content_part.added", **ids,
                                      part={"type": "output_text", "text": "", "annotations": [], "logprobs": []}))
        self.text += text
        ids = {"item_id": self.open["id"], "output_index": len(self.items) - 1, "content_index": 0}  # type: ignore[index]
        return events + [self._event("response.output_text.delta", **ids, delta=text, logprobs=[])]

    def _reasoning_delta(self, text: str) -> list[dict]:
        events: list[dict] = []
        if self.open is None or self.open["type"] != "reasoning":
            events += self._add(rs.reasoning_item(rs.new_id("rs"), "", status="in_progress"))
            self.text = ""
        self.text += text
        ids = {"item_id": self.open["id"], "output_index": len(self.items) - 1, "content_index": 0}  # type: ignore[index]
        return events + [self._event("response.reasoning_text.delta", **ids, delta=text)]

    def _call_delta(self, call: dict) -> list[dict]:
        fn = call.get("function") or {}
        index = call.get("index", len(self.tool_items))
        events: list[dict] = []
        item = self.tool_items.get(index)
        if item is None:
            item = rs.call_item(rs.new_id("fc"), call.get("id") or rs.new_id("call"), fn.get("name", ""), "",
                                status="in_progress")
            self.tool_items[index] = item
            events += self._add(item)
        elif item is not self.open:
            return events  # a late piece of an item already closed
        if fn.get("arguments"):
            item["arguments"] += fn["arguments"]
            events.append(self._event("response.function_call_arguments.delta", item_id=item["id"],
                                      output_index=self.items.index(item), delta=fn["arguments"]))
        return events

    def done(self) -> list[dict]:
        """response.completed (or response.incomplete at the token limit)."""
        events = self._close()
        body = self._response("incomplete" if self.finish == "length" else "completed")
        return events + [self._event(f"response.{body['status']}", response=body)]

    def failed(self, code: str, message: str) -> list[dict]:
        """response.failed: the generation broke off."""
        body = self._response("failed")
        body["error"] = {"code": code, "message": message}
        return [self._event("response.failed", response=body)]


class ResponseEvents:
    """The sink the chat path streams into: writes each chunk's Responses events to the client."""

    def __init__(self, stream: EventStream, translator: ResponseStream) -> None:
        self.stream = stream
        self.translator = translator
        self.failed = False

    @property
    def started(self) -> bool:
        """Whether anything was written."""
        return self.stream.started

    def _write(self, events: list[dict]) -> None:
        for event in events:
            self.stream.send(event, event=event["type"])

    def keepalive(self) -> None:
        """While the answer is paused (a lost stage being replaced): a comment, after the response's start."""
        if not self.stream.started:
            self._write(self.translator.start())
        self.stream.comment()

    def send(self, obj: Any) -> None:
        """One OpenAI chunk, error body or b"[DONE]" from the chat path."""
        if not self.stream.started:
            self._write(self.translator.start())
        if obj == b"[DONE]":
            if not self.failed:
                self._write(self.translator.done())
        elif isinstance(obj, dict) and "error" in obj:
            self.failed = True
            err = obj["error"]
            self._write(self.translator.failed(str(err.get("code") or err.get("type") or "server_error"),
                                               str(err.get("message"))))
        else:
            self._write(self.translator.chunk(obj))

    def end(self) -> None:
        """The end of the HTTP stream."""
        self.stream.end()


def _responses(model_name: str, run: ChatRunner, request: Request) -> dict | None:
    req = rs.parse(request.json())
    rid = rs.new_id("resp")
    try:
        body = rs.chat_body(req)
        if req.stream:
            run(request, body, ResponseEvents(request.events(), ResponseStream(req, rid, model_name)))
            return None
        chat = run(request, body, None)
    except OpenAIError as exc:
        raise rs.error_from_chat(exc) from None
    assert chat is not None
    finish = chat["choices"][0].get("finish_reason")
    return rs.response(req, rid, model_name, float(chat.get("created", time.time())), rs.output_items(chat), finish,
                       chat.get("usage"))


def routes(coordinator: Any, run: ChatRunner) -> list[Route]:
    """The Responses API's route over a coordinator (`model_name`) and its chat runner."""
    return [route("POST", PATHS[0], lambda r: _responses(coordinator.model_name, run, r))]
