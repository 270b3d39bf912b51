"""OpenAI-style errors that the router answers itself (the backends' errors pass through)."""

from __future__ import annotations


class RouterError(Exception):
    """An error answered as `{"error": {message, type, param, code}}` with an HTTP status."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type_, code, param

    def body(self) -> dict:
        """The JSON error document, shaped as OpenAI's."""
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
