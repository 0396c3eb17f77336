"""The one error type the HTTP layer turns into ``{"error": {...}}`` responses."""

from __future__ import annotations

from typing import Any

_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
          413: "RequestTooLargeError",
          500: "InternalServerError", 503: "ServiceUnavailableError", 504: "TimeoutError"}


class ApiError(Exception):
    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}  # e.g. Retry-After on 503

    @property
    def error_type(self) -> str:
        return _TYPES.get(self.status, "BadRequestError" if self.status < 500 else "ServerError")

    def body(self) -> dict[str, Any]:
        # OpenAI's error shape; the openai client surfaces error.message to the caller.
        return {"error": {"message": self.message, "type": self.error_type, "code": self.status}}


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)
