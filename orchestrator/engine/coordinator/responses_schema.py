"""OpenAI Responses API ⇄ the coordinator's OpenAI chat body (pure translators; no I/O).

`POST /v1/responses` runs as one chat body, like every API the coordinator serves: `input`
(text or items: messages, function_call, function_call_output) and `instructions` become chat
messages, function tools become chat tools, `text.format` becomes `response_format`. The
chat answer becomes a `response` object with message and function_call output items.

The server is stateless: nothing is stored, so `previous_response_id`, `conversation`,
`store: true`, `background` and item references are refused (400 naming the field).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

from pydantic import ConfigDict, Field

from orchestrator.engine.coordinator.chat_fields import (
    SAMPLING_EXTENSIONS,
    SamplingExtensions,
    renamed_error,
    set_fields,
)
from orchestrator.httpkit import OpenAIError, validate

# Accepted and without effect: identification, caching and serving hints, and `reasoning` (the
# model served here produces no reasoning items, so there is nothing to configure or include).
IGNORED = frozenset({"metadata", "user", "safety_identifier", "prompt_cache_key", "prompt_cache_retention",
                     "service_tier", "stream_options", "reasoning", "max_tool_calls"})
STATELESS = "this server is stateless: it stores no responses or conversations (send the whole input each time)"
REFUSED = {
    "previous_response_id": STATELESS,
    "conversation": STATELESS,
    "background": "background responses need stored responses; " + STATELESS,
    "prompt": "stored prompt templates need stored state; " + STATELESS,
    "top_logprobs": "log-probabilities are served by /v1/chat/completions (logprobs, top_logprobs)",
}
INCLUDABLE = frozenset({"reasoning.encrypted_content"})  # asked by stateless agents; there is never any
# pipeserve extensions: the chat path's sampling options (and top_k, stop), passed through as they are.
EXTENSIONS = (*SAMPLING_EXTENSIONS, "top_k", "stop")
FIELD_NAMES = {"max_tokens": "max_output_tokens", "messages": "input", "response_format": "text.format",
               "response_format.json_schema": "text.format"}


class ResponsesRequest(SamplingExtensions):
    """POST /v1/responses (refused and ignored fields are handled by `parse`)."""

    model_config = ConfigDict(extra="forbid")

    model: str
    input: str | list[dict[str, Any]]
    instructions: str | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    stream: bool = False
    store: bool | None = None
    text: dict[str, Any] | None = None
    include: list[str] | None = None
    truncation: Literal["disabled"] | None = None
    top_k: Any = None
    stop: Any = None


def parse(body: dict) -> ResponsesRequest:
    """Validate a Responses body; 400 naming the field."""
    for key in body:
        if key in REFUSED:
            raise OpenAIError(400, f"{key}: not supported: {REFUSED[key]}", param=key, code="unsupported_parameter")
        if key not in ResponsesRequest.model_fields and key not in IGNORED:
            raise OpenAIError(400, f"{key}: unknown parameter (see docs/api.md for what this server accepts)",
                              param=key, code="unknown_parameter")
    req = validate(ResponsesRequest, {k: v for k, v in body.items() if k not in IGNORED})
    if req.store:
        raise OpenAIError(400, f"store: true is not supported: {STATELESS}; send store: false", param="store",
                          code="unsupported_parameter")
    for item in req.include or []:
        if item not in INCLUDABLE:
            raise OpenAIError(400, f"include: {item!r} is not supported (only {sorted(INCLUDABLE)})", param="include")
    return req


def _text(content: Any, where: str) -> str:
    """The text of a message's content: a string or input_text / output_text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise OpenAIError(400, f"{where}: expected a string or a list of content parts", param=where)
    parts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in ("input_text", "output_text", "text") and isinstance(part.get("text"), str):
            parts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            parts.append(part["refusal"])
        elif kind in ("input_image", "input_file", "input_audio"):
            raise OpenAIError(400, f"{where}.{i}: {kind} is not supported: the model served here reads text only",
                              param=f"{where}.{i}")
        else:
            raise OpenAIError(400, f"{where}.{i}: content part type {kind!r} is not supported", param=f"{where}.{i}")
    return "".join(parts)


def _messages(req: ResponsesRequest) -> list[dict]:
    out: list[dict] = [{"role": "system", "content": req.instructions}] if req.instructions else []
    if isinstance(req.input, str):
        return out + [{"role": "user", "content": req.input}]
    calls: set[str] = set()
    for i, item in enumerate(req.input):
        where = f"input.{i}"
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise OpenAIError(400, f"{where}.role: {role!r} is not a message role", param=f"{where}.role")
            out.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call_id, name = item.get("call_id"), item.get("name")
            if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(item.get("arguments"), str):
                raise OpenAIError(400, f"{where}: a function_call needs call_id, name and arguments (a JSON string)",
                                  param=where)
            calls.add(call_id)
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": item["arguments"]}}
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)  # one assistant turn: its text and its calls
            else:
                out.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if call_id not in calls:
                raise OpenAIError(400, f"{where}.call_id: {call_id!r} answers no earlier function_call item",
                                  param=f"{where}.call_id")
            output = _text(item.get("output"), f"{where}.output")
            out.append({"role": "tool", "tool_call_id": call_id, "content": output})
        elif kind == "reasoning":
            continue  # echoed back by stateless clients; this model never produced any
        elif kind == "item_reference":
            raise OpenAIError(400, f"{where}: item references are not supported: {STATELESS}", param=where)
        else:
            raise OpenAIError(400, f"{where}.type: item type {kind!r} is not supported (message, function_call, "
                                   "function_call_output)", param=f"{where}.type")
    return out


def _tools(req: ResponsesRequest) -> list[dict]:
    out = []
    for i, tool in enumerate(req.tools or []):
        where = f"tools.{i}"
        if not isinstance(tool, dict) or tool.get("type") != "function":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise OpenAIError(400, f"{where}.type: {kind!r} tools are not supported: only function tools run here",
                              param=f"{where}.type")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise OpenAIError(400, f"{where}.name: a function tool needs a name", param=f"{where}.name")
        fn = {k: tool[k] for k in ("name", "description", "parameters", "strict") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: str | dict[str, Any]) -> Any:
    if isinstance(choice, str):
        if choice not in ("auto", "none", "required"):
            raise OpenAIError(400, f"tool_choice: {choice!r} is not one of auto, none, required", param="tool_choice")
        return choice
    if choice.get("type") != "function" or not isinstance(choice.get("name"), str):
        raise OpenAIError(400, "tool_choice: only auto, none, required or {\"type\": \"function\", \"name\": ...}",
                          param="tool_choice")
    return {"type": "function", "function": {"name": choice["name"]}}


def _response_format(text: dict[str, Any] | None) -> dict | None:
    fmt = (text or {}).get("format")
    if fmt is None or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return {"type": "json_object"}
    if fmt.get("type") == "json_schema":
        schema = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": schema}
    raise OpenAIError(400, f"text.format.type: {fmt.get('type')!r} is not one of text, json_object, json_schema",
                      param="text.format.type")


def chat_body(req: ResponsesRequest) -> dict:
    """The OpenAI chat body that asks the pipeline what `req` asks."""
    body: dict[str, Any] = {"model": req.model, "messages": _messages(req), "stream": req.stream}
    if req.stream:
        body["stream_options"] = {"include_usage": True}
    if req.tools:
        body["tools"] = _tools(req)
    if req.tool_choice is not None:
        body["tool_choice"] = _tool_choice(req.tool_choice)
    fmt = _response_format(req.text)
    if fmt is not None:
        body["response_format"] = fmt
    body.update({k: v for k, v in (("max_tokens", req.max_output_tokens), ("temperature", req.temperature),
                                   ("top_p", req.top_p), ("parallel_tool_calls", req.parallel_tool_calls))
                 if v is not None})
    body.update(set_fields(req, EXTENSIONS))
    return body


def error_from_chat(exc: OpenAIError) -> OpenAIError:
    """A chat-path error naming the field as the Responses client sent it."""
    return renamed_error(exc, FIELD_NAMES, OpenAIError)


def new_id(prefix: str) -> str:
    """A fresh id: resp_, msg_, fc_."""
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def usage(chat_usage: dict | None) -> dict:
    """Responses usage from chat usage."""
    u = chat_usage or {}
    prompt, completion = int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0))
    cached = int(((u.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached}, "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + completion}


def text_item(item_id: str, text: str, status: str = "completed") -> dict:
    """An assistant message output item."""
    done = status == "completed"
    content = [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if done else []
    return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": content}


def reasoning_item(item_id: str, text: str, status: str = "completed") -> dict:
    """A reasoning output item (a thinking model's reasoning, mlx_lm.server's `reasoning` field)."""
    content = [{"type": "reasoning_text", "text": text}] if status == "completed" else []
    return {"type": "reasoning", "id": item_id, "status": status, "summary": [], "content": content}


def call_item(item_id: str, call_id: str, name: str, arguments: str, status: str = "completed") -> dict:
    """A function_call output item."""
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name, "arguments": arguments,
            "status": status}


def response(req: ResponsesRequest, rid: str, model: str, created: float, output: list[dict], finish: str | None,
             chat_usage: dict | None, status: str | None = None) -> dict:
    """The `response` object (in progress while `finish` is None and no status is given)."""
    if status is None:
        status = "in_progress" if finish is None else "incomplete" if finish == "length" else "completed"
    tools = [{"type": "function", "name": t["name"], "description": t.get("description"),
              "parameters": t.get("parameters"), "strict": t.get("strict", False)} for t in (req.tools or [])]
    return {
        "id": rid, "object": "response", "created_at": created, "status": status, "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
        "instructions": req.instructions, "max_output_tokens": req.max_output_tokens, "model": model,
        "output": output, "parallel_tool_calls": req.parallel_tool_calls is not False,
        "temperature": req.temperature if req.temperature is not None else 1.0,
        "top_p": req.top_p if req.top_p is not None else 1.0,
        "tool_choice": req.tool_choice if req.tool_choice is not None else "auto", "tools": tools,
        "text": req.text or {"format": {"type": "text"}}, "truncation": "disabled", "store": False,
        "metadata": {}, "usage": usage(chat_usage) if chat_usage is not None else None,
        "completed_at": time.time() if status == "completed" else None,
    }


def output_items(chat: dict) -> list[dict]:
    """A whole chat.completion's message as output items: the text (if any), then one per tool call."""
    msg = chat["choices"][0].get("message") or {}
    calls = msg.get("tool_calls") or []
    items = [reasoning_item(new_id("rs"), msg["reasoning"])] if msg.get("reasoning") else []
    if msg.get("content") or not calls:
        items.append(text_item(new_id("msg"), msg.get("content") or ""))
    for call in calls:
        fn = call.get("function") or {}
        items.append(call_item(new_id("fc"), call.get("id") or new_id("call"), fn.get("name", ""),
                               fn.get("arguments") or json.dumps({})))
    return items
