"""API errors, and how each dialect writes them.

OpenAI clients expect {"error": {"message", "type", "param", "code"}}; Ollama clients expect
{"error": "message"}; Anthropic clients expect {"type": "error", "error": {"type", "message"}}.
All read the HTTP status, and a 429 carries Retry-After so a client backs off instead of
hammering a busy box.
"""

import json
import math
from typing import Literal

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.defaults import page_not_found

from inference.engine.refusals import RefusalKind, Refused

Dialect = Literal["openai", "ollama", "anthropic"]

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

# The Anthropic error `type` for each status (what its SDK maps to exception classes); any other
# status is an api_error.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
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
        if dialect == "anthropic":
            kind = _ANTHROPIC_TYPES.get(self.status, "api_error")
            return {"type": "error", "error": {"type": kind, "message": self.message}}
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


# The one table from a refusal's kind (inference.engine.refusals) to a status and an error code.
REFUSAL_STATUS: dict[RefusalKind, tuple[int, str | None]] = {
    RefusalKind.INVALID: (400, "invalid_value"),
    RefusalKind.TOO_LONG: (400, "context_length_exceeded"),
    RefusalKind.BUSY: (429, "engine_busy"),
    RefusalKind.UNAVAILABLE: (503, "engine_unavailable"),
    RefusalKind.LOAD_FAILED: (503, "model_load_failed"),
    RefusalKind.NO_MEMORY: (507, "insufficient_memory"),  # a load (or num_ctx) too big for memory
    RefusalKind.FAILED: (500, "generation_failed"),
}


def refused(kind: str | None, message: str, field: str | None = None) -> ApiError:
    """The ApiError of a refusal of this kind (an unknown kind: the request failed)."""
    known = kind in RefusalKind.__members__.values()
    status, code = REFUSAL_STATUS[RefusalKind(kind) if known else RefusalKind.FAILED]
    retry = 1.0 if status == 429 else None
    return ApiError(status, message or "the generation failed", param=field, code=code,
                    retry_after=retry)  # fmt: skip


def from_event(event: dict) -> ApiError:
    """The ApiError for an error event from the inference client."""
    return refused(event.get("code"), event.get("message") or "", event.get("field"))


def from_refusal(exc: Refused) -> ApiError:
    """The ApiError for a refusal raised on the web side (a sampling value out of bounds)."""
    return refused(exc.kind, exc.message, exc.field)


def unknown_endpoint(dialect: Dialect):
    """The view for any other path under /v1/ or /api/: a JSON 404 in the dialect its clients
    read, never the HTML page a browser gets."""

    @csrf_exempt
    def view(request: HttpRequest, rest: str = "") -> HttpResponse:
        return ApiError(404, f"there is no endpoint {request.path}").response(dialect)

    return view


# llama-server's root-level API (tools/server/server.cpp), beside the routes the appliance
# serves: a client of it asking for one that is not here gets a JSON 404, whatever it accepts.
LLAMA_SERVER_ROOTS = frozenset((
    "health", "slots", "lora-adapters", "completion", "completions", "infill", "embedding",
    "embeddings", "rerank", "reranking", "props", "models", "tokenize", "detokenize",
    "apply-template", "metrics", "v1", "v2", "api",
))  # fmt: skip


def wants_json(request: HttpRequest) -> bool:
    """Whether a 404 for this request should be JSON rather than the HTML page: a path under
    llama-server's root-level API (its first segment, or one that starts like /v1: /v1beta),
    a JSON body, or a client that does not ask for HTML (an API client or curl, not a browser).
    (llama-server's /chat/completions is left out: /chat/ is the chat page's.)"""
    first = request.path.strip("/").split("/", 1)[0]
    accept = request.headers.get("Accept", "")
    browser = "text/html" in accept or "application/xhtml" in accept
    return (first in LLAMA_SERVER_ROOTS or first.startswith(("v1", "v2")) or
            "json" in request.content_type or not browser)  # fmt: skip


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """The site's 404 (handler404): JSON in the OpenAI shape for what is asked by an API client
    (wants_json), the HTML page for a browser."""
    if not wants_json(request):
        return page_not_found(request, exception)
    # No route at all, or a page's view that found nothing to show (its own Http404).
    message = (f"there is no endpoint {request.path}" if request.resolver_match is None
               else f"not found: {request.path}")  # fmt: skip
    return ApiError(404, message, code="not_found").response("openai")
