"""One request as a route sees it: bounded body reading, JSON parsing, disconnect detection.

Length rules: a body needs one numeric Content-Length (no chunked encoding); a missing
(unless the app allows it), negative, non-numeric or conflicting length is refused before
any byte is read (411/400), a body over the app's `max_body` is refused (413), and every
refusal closes the connection so unread bytes are never parsed as the next request.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from pydantic import BaseModel, ValidationError

from orchestrator.httpkit.errors import OpenAIError
from orchestrator.httpkit.sse import EventStream
from orchestrator.httpkit.upstream import peer_closed

if TYPE_CHECKING:
    from orchestrator.httpkit.handler import Handler

M = TypeVar("M", bound=BaseModel)

_LENGTH = re.compile(r"[0-9]{1,18}")


@dataclass
class Streamed:
    """A result that writes its own body (file downloads): `write(handler)` after the headers."""

    status: int
    headers: dict[str, str]
    write: Callable[[Any], None]


@dataclass
class Raw:
    """A complete non-JSON answer (Prometheus text)."""

    data: bytes
    content_type: str
    status: int = 200


def parse_json(raw: bytes) -> Any:
    """A JSON document; 400 for invalid, non-UTF-8 or too deeply nested input."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise OpenAIError(400, "request body is not valid JSON: nested too deeply", code="invalid_json") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise OpenAIError(400, f"request body is not valid JSON: {exc}", code="invalid_json") from None


def validate(model: type[M], data: Any) -> M:
    """`model.model_validate(data)`, a pydantic error turned into a 400 naming the first bad field."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or None
        message = str(first.get("msg", "invalid value"))
        raise OpenAIError(400, f"{where}: {message}" if where else message, param=where,
                          code="invalid_field") from None
    except ValueError as exc:  # a validator's own ValueError subclass escaping pydantic
        raise OpenAIError(400, str(exc), code="invalid_field") from None


@dataclass
class Request:
    """One request as a route handler sees it."""

    handler: "Handler"
    method: str
    path: str
    params: dict[str, str] = field(default_factory=dict)
    query: dict[str, str] = field(default_factory=dict)
    context: dict[str, Any] = field(default_factory=dict)  # what `authorize` or the route learnt
    consumed: bool = False

    def header(self, name: str) -> str | None:
        """A request header, or None."""
        return self.handler.headers.get(name)

    def _length(self) -> int | None:
        """The declared body length; None when there is no body header at all."""
        if self.header("Transfer-Encoding") is not None:
            raise OpenAIError(411, "send the request body with a Content-Length (chunked bodies are not accepted)",
                              code="length_required")
        values = self.handler.headers.get_all("Content-Length") or []
        if not values:
            return None
        if len(set(values)) != 1 or not _LENGTH.fullmatch(values[0].strip()):
            raise OpenAIError(400, f"invalid Content-Length {', '.join(values)!r}", code="invalid_length")
        return int(values[0])

    def body_bytes(self) -> bytes:
        """The whole body, within `max_body` (413) and the body deadline.

        A missing, negative or non-numeric length is refused (411/400) before any byte is
        read, and every refusal closes the connection: unread body bytes must never be
        parsed as the next request.
        """
        try:
            return self._read()
        except OpenAIError:
            self.handler.close_connection = True  # whatever was not read must not become a request
            raise

    def _read(self) -> bytes:
        app = self.handler.server.app
        length = self._length()
        if length is None:
            if not app.empty_body_ok:
                raise OpenAIError(411, "Content-Length required", code="length_required")
            self.consumed = True
            return b""
        if length > app.max_body:
            raise OpenAIError(413, f"request body over {app.max_body} bytes", code="body_too_large")
        data = self.handler.read_body(length)
        if data is None:
            raise OpenAIError(400, f"the body ended before its Content-Length ({length} bytes)", code="short_body")
        self.consumed = True
        return data

    def json(self, model: type[M] | None = None) -> Any:
        """The body as a JSON object (validated as `model` when given); 400 otherwise."""
        raw = self.body_bytes()
        data = parse_json(raw) if raw.strip() or not self.handler.server.app.empty_body_ok else {}
        if not isinstance(data, dict):
            raise OpenAIError(400, "request body must be a JSON object", code="invalid_json")
        return validate(model, data) if model is not None else data

    def client_gone(self) -> bool:
        """True once the client closed its side (checked without blocking or consuming input)."""
        return peer_closed(self.handler.connection)

    def events(self) -> EventStream:
        """A server-sent event stream answering this request (headers go out with the first event)."""
        return EventStream(self.handler)
