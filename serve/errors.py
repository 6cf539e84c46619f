"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with the HTTP status.

Every refusal the server makes is an ``ApiError``; the app turns it (and
FastAPI's own validation errors) into this JSON. No traceback ever reaches a
client: anything unexpected is a 500 with a one-line message, and the
traceback goes to the server's log.
"""

from __future__ import annotations

from typing import Any

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    503: "server_error",
    504: "timeout_error",
}


class ApiError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}  # Retry-After on a 503

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.param, self.code)


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"), "param": param, "code": code}}


# The runtime's causes of finish_reason "error" (runtime/request.py: ERROR_CAUSES) -> the choice's error type and code
CHOICE_ERRORS = {"grammar": ("invalid_request_error", "grammar_failed"), "nonfinite_logits": ("server_error", "nonfinite_logits")}


def choice_error(cause: str, message: str, grammar_param: str | None) -> dict[str, Any]:
    """The error object of a choice that ended with finish_reason "error" (an extension beside it, OpenAI's shape)."""
    kind, code = CHOICE_ERRORS.get(cause, ("server_error", cause))
    return {"message": message or "the request failed", "type": kind, "param": grammar_param if cause == "grammar" else None, "code": code}
