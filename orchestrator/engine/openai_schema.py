"""OpenAI-compatible request models and response builders (pure; no I/O)."""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP = 4


class _Common(BaseModel):
    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    seed: int | None = None
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
        return stops

    @property
    def include_usage(self) -> bool:
        """Whether a streamed response ends with a usage chunk."""
        return bool((self.stream_options or {}).get("include_usage"))


class ChatMessage(BaseModel):
    """One chat message; content may be a string or a list of text parts."""

    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | list[dict[str, Any]] | None = None

    def text(self) -> str:
        """The message's text, joining text parts."""
        if isinstance(self.content, list):
            return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")
        return self.content or ""


class ChatRequest(_Common):
    """POST /v1/chat/completions."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @property
    def token_limit(self) -> int | None:
        """The requested completion limit."""
        return self.max_completion_tokens or self.max_tokens

    @property
    def top_k(self) -> int:
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
    def top_k(self) -> int:
        """How many alternatives to return per token."""
        return self.logprobs or 0


def completion_id(kind: str) -> str:
    """A fresh response id."""
    return f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{uuid.uuid4().hex[:24]}"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    """The usage block."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def response(kind: str, rid: str, model: str, text: str, finish: str | None, usage_: dict | None,
             logprobs: Any = None, stream: bool = False) -> dict:
    """A full response or one stream chunk, for chat or completions."""
    if kind == "chat":
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
        if stream:
            choice["delta"] = {"role": "assistant", "content": text} if text or finish is None else {}
        else:
            choice["message"] = {"role": "assistant", "content": text}
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
