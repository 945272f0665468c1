"""API errors, and how each dialect writes them.

OpenAI clients expect {"error": {"message", "type", "param", "code"}}; Ollama clients expect
{"error": "message"}. Both read the HTTP status, and a 429 carries Retry-After so a client backs
off instead of hammering a busy box.
"""

import json
import math
from typing import Literal

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

Dialect = Literal["openai", "ollama"]

# The OpenAI error `type` for each status (what its SDK maps to exception classes).
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
}


class ApiError(Exception):
    """A request the API answers with an error status instead of a result."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        retry_after: float | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.retry_after = retry_after
        self.headers = dict(headers or {})

    def body(self, dialect: Dialect) -> dict:
        if dialect == "ollama":
            return {"error": self.message}
        return {
            "error": {
                "message": self.message,
                "type": _OPENAI_TYPES.get(self.status, "server_error"),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, dialect: Dialect) -> HttpResponse:
        response = HttpResponse(
            json.dumps(self.body(dialect)), status=self.status, content_type="application/json"
        )
        if self.retry_after is not None:
            response["Retry-After"] = str(max(1, math.ceil(self.retry_after)))
        for name, value in self.headers.items():
            response[name] = value
        return response


def invalid(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value" if param else None)


# The inference client's refusal codes (inference.serving.client) and the status each one gets.
_REFUSALS = {
    "invalid": (400, None),
    "too_long": (400, "context_length_exceeded"),
    "busy": (429, "engine_busy"),
    "load_failed": (503, "model_load_failed"),
    "no_memory": (507, "insufficient_memory"),  # a load (or num_ctx) too big for free memory
    "unavailable": (503, "engine_unavailable"),
}


def from_event(event: dict) -> ApiError:
    """The ApiError for an error event from the inference client."""
    status, code = _REFUSALS.get(event.get("code") or "", (500, "generation_failed"))
    message = event.get("message") or "the generation failed"
    retry = 1.0 if status == 429 else None
    return ApiError(status, message, param=event.get("field"), code=code, retry_after=retry)


def unknown_endpoint(dialect: Dialect):
    """The view for any other path under /v1/ or /api/: a JSON 404 in the dialect its clients
    read, never the HTML page a browser gets."""

    @csrf_exempt
    def view(request: HttpRequest, rest: str = "") -> HttpResponse:
        return ApiError(404, f"there is no endpoint {request.path}").response(dialect)

    return view
