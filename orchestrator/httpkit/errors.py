"""The one error type of pipeserve's HTTP servers, answered as an OpenAI-style JSON body.

Coordinator, router and node agent all raise `OpenAIError`; the toolkit's dispatcher is the
one place that turns it (or a bug, or malformed input) into a response.
"""

from __future__ import annotations

# The `type` an error gets when the raiser does not name one (OpenAI's vocabulary where it has one).
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 405: "invalid_request_error", 409: "conflict_error",
          411: "invalid_request_error", 413: "invalid_request_error", 416: "invalid_request_error",
          429: "rate_limit_error", 503: "service_unavailable", 507: "insufficient_storage"}

RETRY_AFTER_S = 1  # what an overloaded server asks a client to wait before retrying


class OpenAIError(Exception):
    """An error answered as `{"error": {message, type, param, code}}` with an HTTP status.

    `headers` are sent with the answer (429 and 503 carry `Retry-After` by default, so a
    client backs off instead of hammering an overloaded server).
    """

    def __init__(self, status: int, message: str, type: str | None = None,
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type or _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error")
        self.param = param
        self.code = code
        self.headers = dict(headers or {})
        if status in (429, 503):
            self.headers.setdefault("Retry-After", str(RETRY_AFTER_S))

    def body(self) -> dict:
        """The JSON error document, shaped as OpenAI's."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def overloaded(message: str, code: str = "overloaded") -> OpenAIError:
    """Past capacity: 429 with Retry-After (never a 5xx, so clients and routers retry later)."""
    return OpenAIError(429, message, "rate_limit_error", code=code)


# Anthropic's error `type` by status (its documented vocabulary); other 4xx are invalid requests, 5xx api errors.
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                    404: "not_found_error", 408: "timeout_error", 413: "request_too_large",
                    429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error"}


class AnthropicError(OpenAIError):
    """An error answered in Anthropic's shape: `{"type": "error", "error": {"type", "message"}}`.

    The message names the offending field (Anthropic's bodies have no `param`), so a client
    of /v1/messages sees which field was wrong.
    """

    def body(self) -> dict:
        """The JSON error document, shaped as Anthropic's."""
        kind = _ANTHROPIC_TYPES.get(self.status, "api_error" if self.status >= 500 else "invalid_request_error")
        message = self.message
        if self.param and not message.startswith(self.param):
            message = f"{self.param}: {message}"
        return {"type": "error", "error": {"type": kind, "message": message}}


def as_anthropic(exc: OpenAIError) -> AnthropicError:
    """The same error (status, message, field, headers) in Anthropic's shape."""
    if isinstance(exc, AnthropicError):
        return exc
    return AnthropicError(exc.status, exc.message, exc.type, exc.param, exc.code, exc.headers)
