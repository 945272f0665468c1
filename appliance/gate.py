"""The gate in front of Django: refuse hostile HTTP requests from their headers alone, and stamp
each request's arrival.

Django's ASGI handler reads the whole body (spooled to a temporary file) before any view or
middleware runs, so a view's 401 or 413 comes only after the last byte has been received and
copied. This ASGI middleware answers before reading anything:

- 401 for a keyed API endpoint called with a body but without a valid key (`Authorization:
  Bearer <key>` or `x-api-key: <key>`, read by dashboard.api.auth's `presented_key`, as the views
  read it);
- 302 to the sign-in page for POST /models/upload/ without a session cookie;
- 413 for an API body over the endpoint's cap, from its Content-Length, or, for a body without
  one (chunked), as soon as the bytes counted so far pass the cap.

What is keyed and how large a body may be are not the gate's to decide: it resolves the path
(/v1/*, /api/*, and dashboard.api.urls' ROOT_PATHS: /metrics, /tokenize, ...) to its view and
reads what the view declared with `api_endpoint` (dashboard.api.auth's EndpointPolicy): keyed
unless its `public()` says open (/api/openapi.json always, /metrics when METRICS_PUBLIC), the cap
its `max_body` or DATA_UPLOAD_MAX_MEMORY_SIZE (what parse_body accepts). So an endpoint is gated
the day it is declared, and no list here can fall behind the views. A path whose view declares
nothing (an unknown API path's JSON 404) is judged on its size only.

Full checks (scope, rate, staff) stay in the views. Bodiless requests pass through, so Django
still answers 404 for unknown API paths and 405 for wrong methods as before. WebSockets pass
untouched.

It also stamps each request's arrival (appliance.arrival), so that a generation's clock (TTFT,
queue time) starts when the request reached the application, not when the view got round to it.

The gate depends on the API's declarations, never the other way round, so it is imported once
Django is set up (appliance.asgi does that first) and needs no lazy import.

`manage.py serve` runs uvicorn, which calls the application once the headers are in and streams
the body to it, so the gate answers before an unwanted body is sent (tests/appliance). Daphne,
which served the appliance before, read the whole body first: there the gate saved only the
work after it.
"""

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from http.cookies import SimpleCookie
from urllib.parse import quote

from asgiref.sync import sync_to_async
from django.conf import settings
from django.shortcuts import resolve_url
from django.urls import Resolver404, resolve

from appliance.arrival import stamped
from dashboard.api.auth import KEY_HEADERS, key_for, policy_of, presented_key
from dashboard.api.errors import ApiError, Dialect
from dashboard.api.urls import ROOT_PATHS

UPLOAD_PATH = "/models/upload/"

Responder = Callable[[Callable], Awaitable[None]]  # given `send`, sends a whole answer


@dataclass(frozen=True, slots=True)
class ApiRule:
    """What the gate holds a request to an API path to, from its view's declaration."""

    dialect: Dialect
    keyed: bool
    cap: int


def api_rule(path: str) -> ApiRule | None:
    """The gate's rule for `path`: None off the API; else read from the view's EndpointPolicy
    (asked now: `public()` may depend on settings), or, for a view that declares none, no key
    and the default cap."""
    if not (path.startswith(("/v1/", "/api/")) or path in ROOT_PATHS):
        return None
    try:
        policy = policy_of(resolve(path).func)
    except Resolver404:
        policy = None
    if policy is None:
        dialect: Dialect = "ollama" if path.startswith("/api/") else "openai"
        return ApiRule(dialect, keyed=False, cap=settings.DATA_UPLOAD_MAX_MEMORY_SIZE)
    return ApiRule(policy.dialect, keyed=policy.needs_key(), cap=policy.body_cap())


def _header(scope: dict, name: bytes) -> bytes | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value
    return None


def _presented_key(scope: dict) -> str | None:
    def text(name: bytes) -> str:
        return (_header(scope, name) or b"").decode("latin-1")

    return presented_key(text(b"authorization"), text(b"x-api-key"))


def _has_cookie(scope: dict, name: str) -> bool:
    raw = _header(scope, b"cookie")
    if not raw:
        return False
    cookie = SimpleCookie()
    try:
        cookie.load(raw.decode("latin-1"))
    except Exception:  # noqa: BLE001 - a malformed cookie header is no session
        return False
    morsel = cookie.get(name)
    return morsel is not None and bool(morsel.value)


def _body_length(scope: dict) -> int | None:
    """The declared Content-Length (0 when unreadable), or None when the header is absent."""
    raw = _header(scope, b"content-length")
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return 0


class BodyGate:
    """ASGI middleware: see the module's docstring."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        with stamped(scope) as scope:
            path = scope["path"]
            if path == UPLOAD_PATH and scope["method"] == "POST":
                if not _has_cookie(scope, settings.SESSION_COOKIE_NAME):
                    return await _to_login(send, path)
                return await self.app(scope, receive, send)
            rule = api_rule(path)
            if rule is None:
                return await self.app(scope, receive, send)
            length = _body_length(scope)
            refusal = await _refusal(scope, rule, length)
            if refusal is not None:
                return await refusal(send)
            if length is None:
                receive, send = _counting(receive, send, rule.cap, rule.dialect)
            return await self.app(scope, receive, send)


async def _refusal(scope: dict, rule: ApiRule, length: int | None) -> Responder | None:
    """The answer to send instead of calling the application, if the headers earn one."""
    chunked = b"chunked" in (_header(scope, b"transfer-encoding") or b"").lower()
    if not (length or chunked):
        return None  # no body to spare: the view answers (401, 404, 405) as it would
    if rule.keyed:
        raw = _presented_key(scope)
        if raw is None:
            return _responder(401, f"an API key is required: send the header {KEY_HEADERS}",
                              "missing_api_key", rule.dialect,
                              [(b"www-authenticate", b'Bearer realm="appliance"')])  # fmt: skip
        if await sync_to_async(key_for)(raw) is None:
            return _responder(
                401,
                "the API key is not valid or has been revoked",
                "invalid_api_key",
                rule.dialect,
                [(b"www-authenticate", b'Bearer realm="appliance", error="invalid_token"')],
            )
    if length is not None and length > rule.cap:
        return _too_large(rule.dialect)
    return None


async def _to_login(send, path: str) -> None:
    location = f"{resolve_url(settings.LOGIN_URL)}?next={quote(path)}".encode()
    await send({"type": "http.response.start", "status": 302,
                "headers": [(b"location", location), (b"content-length", b"0"),
                            (b"connection", b"close")]})  # fmt: skip
    await send({"type": "http.response.body", "body": b""})


async def _send_json(send, status: int, body: dict, headers: list | None = None) -> None:
    data = json.dumps(body).encode()
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                    (b"connection", b"close"), *(headers or [])],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": data})


def _responder(
    status: int, message: str, code: str, dialect: Dialect, headers: list | None = None
) -> Responder:
    body = ApiError(status, message, code=code).body(dialect)

    async def respond(send):
        await _send_json(send, status, body, headers)

    return respond


def _too_large(dialect: Dialect) -> Responder:
    return _responder(413, "the request body is too large", "request_too_large", dialect)


def _counting(receive, send, cap: int, dialect: str):
    """receive/send for a body without Content-Length: past `cap` bytes, answer 413 and tell the
    application the client left (Django's body reader then gives up)."""
    state = {"seen": 0, "refused": False, "started": False}

    async def counted_receive():
        if state["refused"]:
            return {"type": "http.disconnect"}
        message = await receive()
        if message["type"] == "http.request":
            state["seen"] += len(message.get("body", b""))
            if state["seen"] > cap and not state["started"]:
                state["refused"] = True
                await _too_large(dialect)(send)
                return {"type": "http.disconnect"}
        return message

    async def guarded_send(message):
        if state["refused"]:
            return  # the 413 has been sent; nothing the application says goes out
        if message["type"] == "http.response.start":
            state["started"] = True
        await send(message)

    return counted_receive, guarded_send
