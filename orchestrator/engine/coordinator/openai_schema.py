"""OpenAI-compatible request models and response builders (pure; no I/O)."""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

MAX_STOP = 4
MAX_STOP_CHARS = 1024  # per stop string: matched incrementally (engine/coordinator/textstream.py), so bounded state
MAX_TOOLS = 128  # functions in one request's `tools`
MAX_LOGIT_BIAS = 1024  # entries of `logit_bias`
MAX_CONTEXT_SIZE = 4096  # repetition/presence/frequency context sizes (the last stage keeps that history)
MAX_PENALTY = 1e4  # |presence_penalty|, |frequency_penalty|, |logit_bias values|
# Fields mlx_lm.server or OpenAI accept that pipeserve cannot honour: refused with the reason,
# never silently ignored.
UNSUPPORTED = {
    "adapters": "LoRA adapters are not supported by a split model",
    "draft_model": "a per-request draft model (draft_model) is not supported: a cluster speculates by prompt "
                   "lookup when its speculative_tokens is set (docs/speculation.md)",
    "num_draft_tokens": "a per-request draft length (num_draft_tokens) is not supported: a cluster speculates by "
                        "prompt lookup when its speculative_tokens is set (docs/speculation.md)",
    "functions": "the legacy `functions` field is not supported; use `tools`",
    "function_call": "the legacy `function_call` field is not supported; use `tool_choice`",
    "prediction": "predicted outputs are not supported",
    "audio": "audio output is not supported by a text model",
    "suffix": "`suffix` (insertion) is not supported",
}


def _finite(low: float | None = None, high: float | None = None, default: float = 0.0) -> Any:
    return Field(default=default, ge=low, le=high, allow_inf_nan=False)


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0, allow_inf_nan=False)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(default=0, ge=0)
    min_p: float = _finite(0.0, 1.0)
    repetition_penalty: float = _finite(0.0, MAX_PENALTY)
    repetition_context_size: int = Field(default=20, ge=0, le=MAX_CONTEXT_SIZE)
    presence_penalty: float = _finite(-MAX_PENALTY, MAX_PENALTY)
    presence_context_size: int = Field(default=20, ge=0, le=MAX_CONTEXT_SIZE)
    frequency_penalty: float = _finite(-MAX_PENALTY, MAX_PENALTY)
    frequency_context_size: int = Field(default=20, ge=0, le=MAX_CONTEXT_SIZE)
    xtc_probability: float = _finite(0.0, 1.0)
    xtc_threshold: float = _finite(0.0, 1.0, default=0.1)
    logit_bias: dict[int, float] | None = None
    seed: int | None = Field(default=None, ge=-(1 << 63), lt=1 << 64)
    stop: str | list[str] | None = Field(default=None, validate_default=True)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = Field(default=1, ge=1, le=1)

    @field_validator("stop")
    @classmethod
    def _stop(cls, value: str | list[str] | None) -> list[str]:
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP or any(not s for s in stops):
            raise ValueError(f"stop: at most {MAX_STOP} non-empty strings")
        if any(len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"stop: each string at most {MAX_STOP_CHARS} characters")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value: dict[int, float] | None) -> dict[int, float] | None:
        if value is not None:
            if len(value) > MAX_LOGIT_BIAS:
                raise ValueError(f"at most {MAX_LOGIT_BIAS} entries")
            if any(not (math.isfinite(b) and abs(b) <= MAX_PENALTY) for b in value.values()):
                raise ValueError(f"biases must be finite numbers within +-{MAX_PENALTY:g}")
        return value

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return bool((self.stream_options or {}).get("include_usage"))


class FunctionCall(BaseModel):
    """An assistant's call of a function: arguments as the JSON text OpenAI clients send."""

    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(BaseModel):
    """One entry of an assistant message's `tool_calls`."""

    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(BaseModel):
    """One chat message; content may be a string or a list of text parts."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, value: str | list[dict[str, Any]] | None) -> str | list[dict[str, Any]] | None:
        if isinstance(value, list):
            for part in value:
                kind = part.get("type")
                if kind in ("image_url", "input_image", "image", "input_audio", "file"):
                    raise ValueError(f"{kind} parts are not supported: this model reads text only")
                if kind != "text" or not isinstance(part.get("text"), str):
                    raise ValueError("only 'text' content parts are supported")
        return value

    def text(self) -> str:
        """The message's text, joining text parts."""
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")
        return self.content or ""

    def for_template(self) -> dict[str, Any]:
        """The message as chat templates read it (mlx_lm.server's `process_message_content`: text
        content, tool-call arguments parsed from their JSON text)."""
        out: dict[str, Any] = {**(self.model_extra or {}), "role": self.role, "content": self.text()}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            out["tool_calls"] = [{**({"id": c.id} if c.id is not None else {}), "type": c.type,
                                  "function": {"name": c.function.name, "arguments": _arguments(c.function.arguments)}}
                                 for c in self.tool_calls]
        return out


def _arguments(arguments: str | dict[str, Any]) -> Any:
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments) if arguments else {}
    except ValueError:
        raise ValueError("tool call arguments must be JSON text") from None


class FunctionDef(BaseModel):
    """A tool's function: name, description, JSON-schema parameters."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(BaseModel):
    """One entry of `tools`."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(BaseModel):
    """`tool_choice: {"type": "function", "function": {"name": ...}}`."""

    type: Literal["function"]
    function: dict[str, str]

    @property
    def name(self) -> str:
        """The function that must be called."""
        return self.function.get("name", "")


class JsonSchemaFormat(BaseModel):
    """`response_format.json_schema`."""

    model_config = ConfigDict(extra="ignore")

    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | bool = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """`response_format`: text, any JSON object, or JSON following a schema."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _needs_schema(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("json_schema is required when type is 'json_schema'")
        return self


class ChatRequest(_Common):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=MAX_TOOLS)  # as sent: templates print them
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool = True
    response_format: ResponseFormat | None = None
    chat_template_kwargs: dict[str, Any] | None = None

    @field_validator("tools")
    @classmethod
    def _tools(cls, value: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
        for i, tool in enumerate(value or []):
            try:
                Tool.model_validate(tool)
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first.get("loc", ()))
                raise ValueError(f"tools[{i}].{where}: {first.get('msg')}") from None
        return value

    @property
    def tool_defs(self) -> list[Tool]:
        """`tools`, parsed."""
        return [Tool.model_validate(t) for t in self.tools or []]

    @property
    def token_limit(self) -> int | None:
        """The requested completion limit."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def alternatives(self) -> int:
        """How many alternatives to return per token (0 = none)."""
        return (self.top_logprobs or 0) if self.logprobs else 0


class CompletionRequest(_Common):
    """POST /v1/completions (a single prompt: text or token ids)."""

    prompt: str | list[int]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: bool = False

    @property
    def token_limit(self) -> int | None:
        """The requested completion limit (OpenAI's default for completions is 16)."""
        return self.max_tokens or 16

    @property
    def alternatives(self) -> int:
        """How many alternatives to return per token."""
        return self.logprobs or 0


def refused_field(req: BaseModel) -> tuple[str, str] | None:
    """The first field of UNSUPPORTED the request sets, and why it is refused."""
    for name, value in (req.model_extra or {}).items():
        if name in UNSUPPORTED and value not in (None, False):
            return name, UNSUPPORTED[name]
    return None


def completion_id(kind: str) -> str:
    """A fresh response id."""
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """The usage block; `cached_tokens` prompt tokens came from the prompt cache."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def response(kind: str, rid: str, model: str, text: str, finish: str | None, usage_: dict | None,
             logprobs: Any = None, stream: bool = False, tool_calls: list[dict] | None = None,
             reasoning: str = "") -> dict:
    """A full response or one stream chunk, for chat or completions. A chat message with tool
    calls has `content` null when it has no text (OpenAI's shape); `reasoning` is mlx_lm.server's
    field for a thinking model's reasoning text."""
    if kind == "chat":
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
        if stream:
            delta: dict[str, Any] = {"role": "assistant", "content": text} if text or finish is None else {}
            if not text and (tool_calls or reasoning):
                delta.pop("content", None)
        else:
            delta = {"role": "assistant", "content": text if text or not tool_calls else None}
        if reasoning:
            delta["reasoning"] = reasoning
        if tool_calls:
            delta["tool_calls"] = tool_calls
        choice["delta" if stream else "message"] = delta
        obj = "chat.completion.chunk" if stream else "chat.completion"
    else:
        choice = {"index": 0, "text": text, "finish_reason": finish, "logprobs": logprobs}
        obj = "text_completion"
    body = {"id": rid, "object": obj, "created": int(time.time()), "model": model, "choices": [choice]}
    if usage_ is not None:
        body["usage"] = usage_
    return body


def chat_logprobs(entries: list[tuple[str, float, list[tuple[str, float]]]]) -> dict:
    """Chat-style logprobs: {"content": [{token, logprob, bytes, top_logprobs}]}."""
    def item(tok: str, lp: float) -> dict:
        return {"token": tok, "logprob": lp, "bytes": list(tok.encode())}
    return {"content": [{**item(t, lp), "top_logprobs": [item(a, b) for a, b in top]} for t, lp, top in entries]}


def completion_logprobs(entries: list[tuple[str, float, list[tuple[str, float]]]], offset: int = 0) -> dict:
    """Legacy completions logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
    offsets, pos = [], offset
    for tok, _, _ in entries:
        offsets.append(pos)
        pos += len(tok)
    return {"tokens": [t for t, _, _ in entries], "token_logprobs": [lp for _, lp, _ in entries],
            "top_logprobs": [dict(top) for _, _, top in entries], "text_offset": offsets}
