"""A chat-path error, renamed for a client that sent another API's fields (pure).

Anthropic Messages and Responses run as one OpenAI chat body; when the chat path refuses a
field, the error must name the field as that client sent it (`stop` is `stop_sequences`,
`max_tokens` is `max_output_tokens`, ...).
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel

from orchestrator.httpkit import OpenAIError

E = TypeVar("E", bound=OpenAIError)


class SamplingExtensions(BaseModel):
    """pipeserve extensions of the Anthropic and Responses requests: the chat path's sampling options,
    passed through as they are (validated there), so those clients can ask what an OpenAI client can
    (`extra_body` in the SDKs)."""

    seed: Any = None
    min_p: Any = None
    logit_bias: Any = None
    repetition_penalty: Any = None
    repetition_context_size: Any = None
    presence_penalty: Any = None
    presence_context_size: Any = None
    frequency_penalty: Any = None
    frequency_context_size: Any = None
    cache_salt: Any = None  # not sampling: the prompt-cache scope's salt (orchestrator/cache_scope.py)


SAMPLING_EXTENSIONS = tuple(SamplingExtensions.model_fields)


def rename(name: str, names: dict[str, str]) -> str:
    """`name` (a dotted field path) with its longest chat-field prefix in `names` replaced."""
    for chat_name in sorted(names, key=len, reverse=True):
        if name == chat_name or name.startswith((chat_name + ".", chat_name + "[")):
            return names[chat_name] + name[len(chat_name):]
    return name


def renamed(exc: OpenAIError, names: dict[str, str]) -> tuple[str | None, str]:
    """The error's (param, message) naming the client's fields: the param, and the field a message
    begins with ("stop: at most 4 ..." → "stop_sequences: at most 4 ...")."""
    param = rename(exc.param, names) if exc.param else exc.param
    head, sep, rest = exc.message.partition(":")
    message = rename(head, names) + sep + rest if sep and " " not in head else exc.message
    return param, message


def renamed_error(exc: OpenAIError, names: dict[str, str], kind: type[E]) -> E:
    """A chat-path error as `kind` (the client's error class), naming the field as that client sent it."""
    param, message = renamed(exc, names)
    return kind(exc.status, message, exc.type, param, exc.code, exc.headers)


def set_fields(req: Any, names: tuple[str, ...]) -> dict[str, Any]:
    """The request's fields among `names` that the client set (passed through to the chat body)."""
    return {k: getattr(req, k) for k in names if getattr(req, k) is not None}
