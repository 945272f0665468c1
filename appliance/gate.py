"""The gate in front of Django: refuse hostile HTTP requests from their headers alone, and stamp
each request's arrival.

Django's ASGI handler reads the whole body (spooled to a temporary file) before any view or
middleware runs, so a view's 401 or 413 comes only after the last byte has been received and
copied. This ASGI middleware answers before reading anything:

- 401 for a keyed API endpoint (/v1/*, /api/* but /api/openapi.json, and /metrics unless
  METRICS_PUBLIC) called with a body but without a valid `Authorization: Bearer <key>`;
- 302 to the sign-in page for POST /models/upload/ without a session cookie;
- 413 for an API body over DATA_UPLOAD_MAX_MEMORY_SIZE (what parse_body allows today), from its
  Content-Length, or, for a chunked body, as soon as the bytes counted so far pass the cap.

Full checks (scope, rate, staff) stay in the views. Bodiless requests pass through, so Django
still answers 404 for unknown API paths and 405 for wrong methods as before. WebSockets pass
untouched.

It also stamps the arrival time into the scope (ARRIVED_WALL, ARRIVED_PERF) and into a context
variable, so that a generation's clock (TTFT, queue time) starts when the request reached the
application, not when the view got round to it. The chat socket stamps each frame it receives
the same way (`arrival()`).

`manage.py serve` runs uvicorn, which calls the application once the headers are in and streams
the body to it, so the gate answers before an unwanted body is sent (tests/appliance). Daphne,
which served the appliance before, read the whole body first: there the gate saved only the
work after it.
"""

import contextvars
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import quote

from asgiref.sync import sync_to_async
from django.conf import settings
from django.shortcuts import resolve_url
from django.urls import Resolver404, resolve

ARRIVED_WALL = "appliance.arrived_wall"  # time.time() when the application got the request
ARRIVED_PERF = "appliance.arrived_perf"  # time.perf_counter() at the same moment

_arrived_wall: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "appliance_arrived_wall", default=None
)

# URL names of the API endpoints that need a key (openapi is public, metrics unless configured).
KEYED_ENDPOINTS = frozenset({
    "openai_models", "openai_model", "openai_chat", "openai_completions",
    "ollama_version", "ollama_tags", "ollama_ps", "ollama_show", "ollama_chat",
    "ollama_generate", "ollama_delete", "metrics",
})  # fmt: skip
UPLOAD_PATH = "/models/upload/"


def arrived_wall() -> float | None:
    """The wall-clock arrival of the HTTP request or WebSocket frame being handled, or None
    outside one."""
    return _arrived_wall.get()


@contextmanager
def arrival() -> Iterator[None]:
    """Stamp the arrival of what is handled inside (a WebSocket frame), as the gate does for
    an HTTP request; code run from here, in threads too (sync_to_async), reads it."""
    token = _arrived_wall.set(time.time())
    try:
        yield
    finally:
        _arrived_wall.reset(token)


def _is_api(path: str) -> bool:
    return path.startswith(("/v1/", "/api/")) or path == "/metrics"


def _dialect(path: str) -> str:
    return "ollama" if path.startswith("/api/") else "openai"


def _header(scope: dict, name: bytes) -> bytes | None:
    for key, value in scope.get("headers") or ():
        if key.lower() == name:
            return value
    return None


def _bearer(scope: dict) -> str | None:
    raw = (_header(scope, b"authorization") or b"").decode("latin-1")
    scheme, _, token = raw.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return None
    return token.strip()


def _has_cookie(scope: dict, name: str) -> bool:
    from http.cookies import SimpleCookie

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


def _keyed(path: str) -> bool:
    try:
        match = resolve(path)
    except Resolver404:
        return False
    if match.url_name == "metrics" and settings.METRICS_PUBLIC:
        return False
    return match.url_name in KEYED_ENDPOINTS


def _error(status: int, message: str, code: str, dialect: str) -> dict:
    from dashboard.api.errors import ApiError

    return ApiError(status, message, code=code).body(dialect)


async def _send_json(send, status: int, body: dict, headers: list | None = None) -> None:
    data = json.dumps(body).encode()
    await send({
        "type": "http.response.start", "status": status,
        "headers": [(b"content-type", b"application/json"),
                    (b"content-length", str(len(data)).encode()),
                    (b"connection", b"close"), *(headers or [])],
    })  # fmt: skip
    await send({"type": "http.response.body", "body": data})


async def _key_is_valid(raw: str) -> bool:
    from dashboard.api.auth import MAX_KEY_CHARS, _lookup

    if len(raw) > MAX_KEY_CHARS:
        return False
    return await sync_to_async(_lookup)(raw) is not None


class BodyGate:
    """ASGI middleware: see the module's docstring."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        wall, perf = time.time(), time.perf_counter()
        scope = {**scope, ARRIVED_WALL: wall, ARRIVED_PERF: perf}
        token = _arrived_wall.set(wall)
        try:
            refusal = await self._refusal(scope)
            if refusal is not None:
                return await refusal(send)
            cap = self._cap(scope)
            if cap is not None and _header(scope, b"content-length") is None:
                receive, send = _counting(receive, send, cap, _dialect(scope["path"]))
            return await self.app(scope, receive, send)
        finally:
            _arrived_wall.reset(token)

    def _cap(self, scope) -> int | None:
        if _is_api(scope["path"]):
            return settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return None

    async def _refusal(self, scope):
        path, method = scope["path"], scope["method"]
        length_header = _header(scope, b"content-length")
        chunked = b"chunked" in (_header(scope, b"transfer-encoding") or b"").lower()
        try:
            length = int(length_header) if length_header is not None else 0
        except ValueError:
            length = 0
        has_body = length > 0 or chunked

        if path == UPLOAD_PATH and method == "POST":
            if not _has_cookie(scope, settings.SESSION_COOKIE_NAME):
                login = resolve_url(settings.LOGIN_URL)
                location = f"{login}?next={quote(path)}".encode()

                async def to_login(send):
                    await send({"type": "http.response.start", "status": 302,
                                "headers": [(b"location", location), (b"content-length", b"0"),
                                            (b"connection", b"close")]})  # fmt: skip
                    await send({"type": "http.response.body", "body": b""})

                return to_login
            return None

        if not _is_api(path) or not has_body:
            return None
        dialect = _dialect(path)
        if _keyed(path):
            raw = _bearer(scope)
            if raw is None:
                return _responder(401, "an API key is required: send the header "
                                  "'Authorization: Bearer <key>'", "missing_api_key", dialect,
                                  [(b"www-authenticate", b'Bearer realm="appliance"')])  # fmt: skip
            if not await _key_is_valid(raw):
                return _responder(
                    401,
                    "the API key is not valid or has been revoked",
                    "invalid_api_key",
                    dialect,
                    [(b"www-authenticate", b'Bearer realm="appliance", error="invalid_token"')],
                )
        if length > settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
            return _too_large(dialect)
        return None


def _responder(status, message, code, dialect, headers=None):
    async def respond(send):
        await _send_json(send, status, _error(status, message, code, dialect), headers)

    return respond


def _too_large(dialect: str):
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
