"""Anthropic Messages API ⇄ the coordinator's OpenAI chat body (pure translators; no I/O).

Every API the coordinator serves runs as one OpenAI chat body, so sampling, tools, stop
strings and usage behave the same whichever client asks. This module turns a
`POST /v1/messages` body into that chat body, and the chat answer (whole, or streamed
chunk by chunk) back into Anthropic's `message` and its documented event sequence.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from orchestrator.engine.coordinator.chat_fields import (
    SAMPLING_EXTENSIONS,
    SamplingExtensions,
    renamed_error,
    set_fields,
)
from orchestrator.httpkit import AnthropicError, OpenAIError, as_anthropic, validate

# Accepted and without effect, as Anthropic treats them: request metadata and serving hints.
IGNORED = frozenset({"metadata", "service_tier", "cache_control", "speed", "inference_geo", "user_profile_id",
                     "workspace_id"})
# Known Anthropic fields this server refuses, with why.
REFUSED = {
    "container": "code-execution containers are Anthropic-hosted tools",
    "mcp_servers": "remote MCP servers are Anthropic-hosted tools",
    "context_management": "server-side context editing needs stored conversations; this server is stateless",
    "diagnostics": "Anthropic's request diagnostics are not available here",
}
STOP_REASONS = {"length": "max_tokens", "tool_calls": "tool_use"}
# The chat body's field names as an Anthropic client knows them (errors name the client's field).
FIELD_NAMES = {"stop": "stop_sequences", "response_format": "output_config.format",
               "response_format.json_schema.schema": "output_config.format.schema",
               "parallel_tool_calls": "tool_choice.disable_parallel_tool_use"}


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")  # blocks carry hints (cache_control, citations) that change nothing


class Tool(_Open):
    """A custom (client) tool."""

    name: str = Field(min_length=1)
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None


class ToolChoice(_Open):
    """auto / any / tool (a named one) / none."""

    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool = False


class Message(BaseModel):
    """One turn; content is a string or a list of blocks (checked block by block in `_turn`)."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["user", "assistant"]
    content: str | list[dict[str, Any]]


class CountRequest(BaseModel):
    """POST /v1/messages/count_tokens: what shapes the prompt."""

    model_config = ConfigDict(extra="forbid")

    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: ToolChoice | None = None
    thinking: dict[str, Any] | None = None
    output_config: dict[str, Any] | None = None
    output_format: dict[str, Any] | None = None


class MessagesRequest(CountRequest, SamplingExtensions):
    """POST /v1/messages."""

    max_tokens: int = Field(ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = Field(default=None, ge=0.0, le=1.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)


def parse(model: type[CountRequest], body: dict) -> CountRequest:
    """Validate a Messages (or count_tokens) body; 400 in Anthropic's shape naming the field."""
    fields = set(model.model_fields)
    for key in body:
        if key in REFUSED:
            raise AnthropicError(400, f"{key}: not supported: {REFUSED[key]}", param=key)
        if key not in fields and key not in IGNORED:
            raise AnthropicError(400, f"{key}: unknown field (see docs/api.md for what this server accepts)",
                                 param=key)
    try:
        req = validate(model, {k: v for k, v in body.items() if k not in IGNORED})
    except OpenAIError as exc:  # the client expects Anthropic's shape
        raise as_anthropic(exc) from None
    thinking = (req.thinking or {}).get("type", "disabled")
    if thinking != "disabled":
        raise AnthropicError(400, f"thinking: type '{thinking}' is not supported: the model served here has no "
                                  "extended thinking (send {\"type\": \"disabled\"} or omit it)", param="thinking")
    return req


def _text_of(blocks: str | list[dict[str, Any]] | None, where: str) -> str:
    """The text of a string or of a list of text blocks (system, tool_result content)."""
    if blocks is None or isinstance(blocks, str):
        return blocks or ""
    parts = []
    for i, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text" or not isinstance(block.get("text"), str):
            raise _block_error(f"{where}.{i}", kind)
        parts.append(block["text"])
    return "\n".join(parts) if where == "system" else "".join(parts)


def _block_error(where: str, kind: Any) -> AnthropicError:
    if kind in ("image", "document"):
        return AnthropicError(400, f"{where}: {kind} blocks are not supported: the model served here reads text only",
                              param=where)
    return AnthropicError(400, f"{where}: block type {kind!r} is not supported here (text, tool_use, tool_result; "
                               "thinking blocks in assistant turns are dropped)", param=where)


def _turn(msg: Message, n: int, calls: set[str]) -> list[dict]:
    """One Anthropic turn as OpenAI chat messages; `calls` collects the tool_use ids seen so far."""
    where = f"messages.{n}.content"
    if isinstance(msg.content, str):
        return [{"role": msg.role, "content": msg.content}]
    texts: list[str] = []
    tool_calls: list[dict] = []
    results: list[dict] = []
    for i, block in enumerate(msg.content):
        kind = block.get("type")
        at = f"{where}.{i}"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind in ("thinking", "redacted_thinking") and msg.role == "assistant":
            continue  # a client echoes them back; the model here never produced any
        elif kind == "tool_use" and msg.role == "assistant":
            if not isinstance(block.get("id"), str) or not isinstance(block.get("name"), str) \
                    or not isinstance(block.get("input"), dict):
                raise AnthropicError(400, f"{at}: a tool_use block needs id, name and an object input", param=at)
            calls.add(block["id"])
            tool_calls.append({"id": block["id"], "type": "function",
                               "function": {"name": block["name"], "arguments": json.dumps(block["input"])}})
        elif kind == "tool_result" and msg.role == "user":
            call = block.get("tool_use_id")
            if call not in calls:
                raise AnthropicError(400, f"{at}.tool_use_id: {call!r} answers no tool_use block of an earlier "
                                          "assistant turn", param=f"{at}.tool_use_id")
            text = _text_of(block.get("content"), f"{at}.content")
            results.append({"role": "tool", "tool_call_id": call,
                            "content": f"Error: {text}" if block.get("is_error") else text})
        else:
            raise _block_error(at, kind)
    if msg.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
        if tool_calls:
            out["tool_calls"] = tool_calls
        elif out["content"] is None:
            out["content"] = ""
        return [out]
    return results + ([{"role": "user", "content": "".join(texts)}] if texts or not results else [])


def _tools(raw: list[dict[str, Any]], n_where: str = "tools") -> list[dict]:
    out = []
    for i, spec in enumerate(raw):
        kind = spec.get("type") if isinstance(spec, dict) else None
        if kind not in (None, "custom"):
            raise AnthropicError(400, f"{n_where}.{i}.type: {kind!r} is an Anthropic-hosted tool; only custom tools "
                                      "(name, description, input_schema) run here", param=f"{n_where}.{i}.type")
        tool = validate_tool(spec, f"{n_where}.{i}")
        # OpenAI's key order (name, description, parameters): chat templates render the tool as
        # JSON in the order given, so this is the prompt an OpenAI client's same tool gets.
        fn: dict[str, Any] = {"name": tool.name}
        if tool.description is not None:
            fn["description"] = tool.description
        fn["parameters"] = tool.input_schema
        out.append({"type": "function", "function": fn})
    return out


def validate_tool(spec: Any, where: str) -> Tool:
    """One custom tool, 400 naming `where` when malformed."""
    if not isinstance(spec, dict):
        raise AnthropicError(400, f"{where}: a tool is an object", param=where)
    try:
        return Tool.model_validate(spec)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join([where, *(str(p) for p in first.get("loc", ()))])
        raise AnthropicError(400, f"{field}: {first.get('msg')}", param=field) from None


def _tool_choice(choice: ToolChoice, names: list[str]) -> tuple[Any, bool | None]:
    """The OpenAI tool_choice and parallel_tool_calls for an Anthropic tool_choice."""
    if choice.type == "tool":
        if choice.name not in names:
            raise AnthropicError(400, f"tool_choice.name: no tool named {choice.name!r} in tools",
                                 param="tool_choice.name")
        picked: Any = {"type": "function", "function": {"name": choice.name}}
    else:
        picked = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
    return picked, (False if choice.disable_parallel_tool_use else None)


def chat_body(req: CountRequest) -> dict:
    """The OpenAI chat body that asks the pipeline what `req` asks."""
    messages: list[dict] = []
    if req.system:
        messages.append({"role": "system", "content": _text_of(req.system, "system")})
    calls: set[str] = set()
    for n, msg in enumerate(req.messages):
        messages.extend(_turn(msg, n, calls))
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    if req.tools:
        body["tools"] = _tools(req.tools)
    if req.tool_choice is not None:
        names = [t["function"]["name"] for t in body.get("tools", [])]
        body["tool_choice"], parallel = _tool_choice(req.tool_choice, names)
        if parallel is not None:
            body["parallel_tool_calls"] = parallel
    fmt = (req.output_config or {}).get("format") or req.output_format
    if fmt:
        if fmt.get("type") != "json_schema" or not isinstance(fmt.get("schema"), dict):
            raise AnthropicError(400, "output_config.format: expected {\"type\": \"json_schema\", \"schema\": {...}}",
                                 param="output_config.format")
        body["response_format"] = {"type": "json_schema",
                                   "json_schema": {"name": "output", "schema": fmt["schema"], "strict": True}}
    if isinstance(req, MessagesRequest):
        body.update(max_tokens=req.max_tokens, stream=req.stream, stream_options={"include_usage": True})
        if req.stop_sequences:
            body["stop"] = req.stop_sequences
        body.update({k: v for k, v in (("temperature", req.temperature), ("top_p", req.top_p), ("top_k", req.top_k))
                     if v is not None})
        body.update(set_fields(req, SAMPLING_EXTENSIONS))
    return body


def error_from_chat(exc: OpenAIError) -> AnthropicError:
    """A chat-path error (OpenAIError) in Anthropic's shape, naming the field as the client sent it."""
    return renamed_error(exc, FIELD_NAMES, AnthropicError)


def message_id() -> str:
    """A fresh message id."""
    return f"msg_{uuid.uuid4().hex[:24]}"


def usage(chat_usage: dict | None, prompt_tokens: int = 0) -> dict:
    """Anthropic usage from OpenAI usage: input_tokens excludes what the prompt cache served."""
    u = chat_usage or {}
    cached = int(((u.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
    return {"input_tokens": int(u.get("prompt_tokens", prompt_tokens)) - cached,
            "output_tokens": int(u.get("completion_tokens", 0)),
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def stop_reason(finish: str | None, stop_sequence: str | None) -> str:
    """Anthropic's stop_reason for a chat finish_reason."""
    if finish == "stop" and stop_sequence is not None:
        return "stop_sequence"
    return STOP_REASONS.get(finish or "", "end_turn")


def tool_input(arguments: str) -> dict:
    """A tool call's arguments as the object Anthropic's `input` is."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return {"_unparsed_arguments": arguments}  # kept visible rather than dropped
    return value if isinstance(value, dict) else {"_arguments": value}


def message(chat: dict, mid: str, model: str, stop_sequence: str | None) -> dict:
    """A whole chat.completion as an Anthropic message."""
    choice = chat["choices"][0]
    msg = choice.get("message") or {}
    content: list[dict] = []
    if msg.get("reasoning"):  # a thinking model's reasoning (mlx_lm.server's field), as Anthropic shows thinking
        content.append({"type": "thinking", "thinking": msg["reasoning"], "signature": ""})
    calls = msg.get("tool_calls") or []
    if msg.get("content") or not calls:
        content.append({"type": "text", "text": msg.get("content") or ""})
    for call in calls:
        fn = call.get("function") or {}
        content.append({"type": "tool_use", "id": call.get("id"), "name": fn.get("name"),
                        "input": tool_input(fn.get("arguments", ""))})
    reason = stop_reason(choice.get("finish_reason"), stop_sequence)
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": reason, "stop_sequence": stop_sequence if reason == "stop_sequence" else None,
            "usage": usage(chat.get("usage"))}
