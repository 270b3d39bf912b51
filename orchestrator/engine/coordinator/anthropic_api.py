"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API over the chat path.

Thin handlers: the body is translated into the coordinator's OpenAI chat body
(`anthropic_schema`), run by the same code as /v1/chat/completions, and the answer is
translated back. A streamed answer arrives as OpenAI chunks in `MessageEvents`, which writes
Anthropic's documented event sequence: message_start, ping, per content block
content_block_start / content_block_delta (text_delta, thinking_delta for a thinking model's
reasoning, input_json_delta) / content_block_stop,
then message_delta (stop_reason, usage) and message_stop; a failure mid-stream is an `error`
event. Every error is answered in Anthropic's shape.
"""

from __future__ import annotations

from typing import Any, Callable

from orchestrator.engine.coordinator import anthropic_schema as an
from orchestrator.httpkit import AnthropicError, EventStream, OpenAIError, Request, Route, route

PATHS = ("/v1/messages", "/v1/messages/count_tokens")

# Runs an OpenAI chat body for a request: the chat.completion dict, or None once it streamed
# its chunks into the given sink (`started`, `send(obj)`, `end()`).
ChatRunner = Callable[[Request, dict, Any], "dict | None"]

Event = tuple[str, dict]


class MessageStream:
    """OpenAI chat chunks → Anthropic stream events (pure: events are returned, not written)."""

    def __init__(self, mid: str, model: str) -> None:
        self.mid = mid
        self.model = model
        self.next_block = 0
        self.open: int | None = None  # index of the content block being streamed
        self.kind = ""  # that block's type: text, thinking or tool_use
        self.tool_blocks: dict[int, int] = {}  # OpenAI tool_call index → content block index
        self.finish: str | None = None
        self.usage: dict | None = None

    def start(self, input_tokens: int) -> list[Event]:
        """message_start (an empty assistant message) and a ping."""
        usage = an.usage({"prompt_tokens": input_tokens})
        body = {"id": self.mid, "type": "message", "role": "assistant", "model": self.model, "content": [],
                "stop_reason": None, "stop_sequence": None, "usage": usage}
        return [("message_start", {"type": "message_start", "message": body}), ("ping", {"type": "ping"})]

    def _close(self) -> list[Event]:
        if self.open is None:
            return []
        index, self.open = self.open, None
        return [("content_block_stop", {"type": "content_block_stop", "index": index})]

    def _open(self, block: dict) -> list[Event]:
        events = self._close()
        self.open, self.kind = self.next_block, block["type"]
        self.next_block += 1
        events.append(("content_block_start", {"type": "content_block_start", "index": self.open,
                                               "content_block": block}))
        return events

    def _delta(self, delta: dict) -> Event:
        return "content_block_delta", {"type": "content_block_delta", "index": self.open, "delta": delta}

    def chunk(self, chunk: dict) -> list[Event]:
        """The events one chat.completion.chunk makes."""
        events: list[Event] = []
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            if delta.get("reasoning"):  # a thinking model's reasoning (mlx_lm.server's field)
                if self.open is None or self.kind != "thinking":
                    events += self._open({"type": "thinking", "thinking": "", "signature": ""})
                events.append(self._delta({"type": "thinking_delta", "thinking": delta["reasoning"]}))
            if delta.get("content"):
                if self.open is None or self.kind != "text":
                    events += self._open({"type": "text", "text": ""})
                events.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            for call in delta.get("tool_calls") or []:
                events += self._tool_delta(call)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
                events += self._close()
        return events

    def _tool_delta(self, call: dict) -> list[Event]:
        events: list[Event] = []
        fn = call.get("function") or {}
        index = call.get("index", len(self.tool_blocks))
        if index not in self.tool_blocks:
            events += self._open({"type": "tool_use", "id": call.get("id"), "name": fn.get("name"), "input": {}})
            self.tool_blocks[index] = self.open  # type: ignore[assignment]  # just opened
        elif self.open != self.tool_blocks[index]:
            return events  # a late piece of a block already closed: Anthropic blocks do not interleave
        if fn.get("arguments"):
            events.append(self._delta({"type": "input_json_delta", "partial_json": fn["arguments"]}))
        return events

    def done(self, stop_sequence: str | None) -> list[Event]:
        """message_delta (stop_reason, stop_sequence, usage) and message_stop."""
        events = self._close()
        reason = an.stop_reason(self.finish, stop_sequence)
        usage = an.usage(self.usage)
        delta = {"stop_reason": reason, "stop_sequence": stop_sequence if reason == "stop_sequence" else None}
        events.append(("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        events.append(("message_stop", {"type": "message_stop"}))
        return events


class MessageEvents:
    """The sink the chat path streams into: writes each chunk's Anthropic events to the client."""

    def __init__(self, stream: EventStream, request: Request, translator: MessageStream) -> None:
        self.stream = stream
        self.request = request
        self.translator = translator
        self.failed = False

    @property
    def started(self) -> bool:
        """Whether anything was written (an error before that is answered as a plain 4xx/5xx)."""
        return self.stream.started

    def _write(self, events: list[Event]) -> None:
        for name, data in events:
            self.stream.send(data, event=name)

    def _start(self) -> None:
        if not self.stream.started:
            gen = self.request.context.get("generation")
            self._write(self.translator.start(len(gen.prompt) if gen is not None else 0))

    def keepalive(self) -> None:
        """While the answer is paused (a lost stage being replaced): a comment, after the message's start."""
        self._start()
        self.stream.comment()

    def send(self, obj: Any) -> None:
        """One OpenAI chunk, error body or b"[DONE]" from the chat path."""
        gen = self.request.context.get("generation")
        self._start()
        if obj == b"[DONE]":
            if not self.failed:
                self._write(self.translator.done(gen.stop_sequence if gen is not None else None))
        elif isinstance(obj, dict) and "error" in obj:
            self.failed = True
            err = obj["error"]
            status = int(self.request.context.get("status", 500))
            self._write([("error", AnthropicError(status, str(err.get("message")), err.get("type")).body())])
        else:
            self._write(self.translator.chunk(obj))

    def end(self) -> None:
        """The end of the HTTP stream."""
        self.stream.end()


def _messages(model_name: str, run: ChatRunner, request: Request) -> dict | None:
    try:
        req = an.parse(an.MessagesRequest, request.json())
        body = an.chat_body(req)
        mid = an.message_id()
        if req.stream:
            run(request, body, MessageEvents(request.events(), request, MessageStream(mid, model_name)))
            return None
        chat = run(request, body, None)
    except AnthropicError:
        raise
    except OpenAIError as exc:
        raise an.error_from_chat(exc) from None
    assert chat is not None
    gen = request.context.get("generation")
    return an.message(chat, mid, model_name, gen.stop_sequence if gen is not None else None)


def _count_tokens(prepare: Callable[[str, dict], Any], request: Request) -> dict:
    try:
        req = an.parse(an.CountRequest, request.json())
        _, prompt, _ = prepare("chat", an.chat_body(req))
    except AnthropicError:
        raise
    except OpenAIError as exc:
        raise an.error_from_chat(exc) from None
    return {"input_tokens": len(prompt)}


def routes(coordinator: Any, run: ChatRunner) -> list[Route]:
    """The Messages API's routes over a coordinator (`model_name`, `prepare`) and its chat runner."""
    return [
        route("POST", PATHS[0], lambda r: _messages(coordinator.model_name, run, r)),
        route("POST", PATHS[1], lambda r: _count_tokens(coordinator.prepare, r)),
    ]
