"""The gate in front of Django: refuse hostile HTTP requests from their headers alone, and stamp
each request's arrival.

Django's ASGI handler reads the whole body (spooled to a temporary file) before any view or
middleware runs, so a view's 401 or 413 comes only after the last byte has been received and
copied. This ASGI middleware answers before reading anything:

- 401 for a keyed API endpoint called with a body but without a valid key (`Authorization:
  Bearer <key>` or `x-api-key: <key>`, read by dashboard.api.auth's `presented_key`, as the views
  read it);
- 302 to the sign-in page for a page's file upload (POST /models/upload/, and a model page's
  projector, /models/<name>/projector/) without a session cookie;
- for POST /chat/images/ (a picture for the chat page), 401 without a session cookie and 413
  over dashboard.chat.images' MAX_IMAGE_BYTES, from its Content-Length or as it streams;
- 413 for an API body over the endpoint's cap, from its Content-Length, or, for a body without
  one (chunked), as soon as the bytes counted so far pass the cap.

What is keyed and how large a body may be are not the gate's to decide: it resolves the path
(/v1/*, /api/*, and dashboard.api.urls' ROOT_PATHS: /metrics, /tokenize, ...) to its view and
reads what the view declared with `api_endpoint` (dashboard.api.auth's EndpointPolicy): keyed
unless its `public()` says open (/api/openapi.json always, /metrics when METRICS_PUBLIC), the cap
its `max_body` or DATA_UPLOAD_MAX_MEMORY_SIZE (what parse_body accepts). So an endpoint is gated
the day it is declared, and no list here can fall behind the views. A path whose view declares
nothing (an unknown API path's JSON 404) is judged on its size only.

A view that declares `body_to` (POST /api/blobs: a GGUF of gigabytes) has its body streamed by
the gate into a hidden file in that directory, hashed on the way, once the key's scope and the
free disk there allow it (403, 507, from the headers), and is then called with an empty body and
`scope["appliance.body"]` = {"path", "sha256", "size"}; the file is removed after the view
unless the view moved it. Django would otherwise spool the whole body to the system's temp
directory (often a tmpfs or another disk) before the view could refuse or move it.

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

import asyncio
import fcntl
import hashlib
import json
import re
import shutil
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from http.cookies import SimpleCookie
from pathlib import Path
from urllib.parse import quote

from asgiref.sync import sync_to_async
from django.conf import settings
from django.shortcuts import resolve_url
from django.urls import Resolver404, resolve

from appliance.arrival import stamped
from dashboard.api.auth import KEY_HEADERS, key_for, policy_of, presented_key
from dashboard.api.errors import ApiError, Dialect
from dashboard.api.urls import ROOT_PATHS
from dashboard.chat.images import MAX_IMAGE_BYTES

# The pages' file uploads, which stream a file of any size into the models directory.
UPLOAD_PATHS = re.compile(r"^/models/(upload|[-a-zA-Z0-9_]+/projector)/$")
CHAT_IMAGES_PATH = "/chat/images/"

Responder = Callable[[Callable], Awaitable[None]]  # given `send`, sends a whole answer


@dataclass(frozen=True, slots=True)
class ApiRule:
    """What the gate holds a request to an API path to, from its view's declaration."""

    dialect: Dialect
    keyed: bool
    cap: int
    # Only for a body the gate streams itself (body_to: the module's docstring).
    scope: str = field(default="", compare=False)
    body_to: Callable[[], Path] | None = field(default=None, compare=False)


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
    return ApiRule(policy.dialect, keyed=policy.needs_key(), cap=policy.body_cap(),
                   scope=policy.scope, body_to=policy.body_to)  # fmt: skip


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
            if UPLOAD_PATHS.match(path) and scope["method"] == "POST":
                if not _has_cookie(scope, settings.SESSION_COOKIE_NAME):
                    return await _to_login(send, path)
                return await self.app(scope, receive, send)
            if path == CHAT_IMAGES_PATH and scope["method"] == "POST":
                return await _chat_image(self.app, scope, receive, send)
            rule = api_rule(path)
            if rule is None:
                return await self.app(scope, receive, send)
            length = _body_length(scope)
            refusal = await _refusal(scope, rule, length)
            if refusal is not None:
                return await refusal(send)
            if rule.body_to is not None and scope["method"] == "POST" and _has_body(scope):
                return await _streamed(self.app, scope, receive, send, rule, length)
            if length is None:
                receive, send = _counting(receive, send, rule.cap, rule.dialect)
            return await self.app(scope, receive, send)


def _has_body(scope: dict) -> bool:
    chunked = b"chunked" in (_header(scope, b"transfer-encoding") or b"").lower()
    return bool(_body_length(scope) or chunked)


async def _refusal(scope: dict, rule: ApiRule, length: int | None) -> Responder | None:
    """The answer to send instead of calling the application, if the headers earn one."""
    if not _has_body(scope):
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


async def _chat_image(app, scope: dict, receive, send) -> None:
    """A chat page's picture: the page's script reads a JSON refusal (dashboard.web.images)."""
    if not _has_cookie(scope, settings.SESSION_COOKIE_NAME):
        return await _responder(401, "you have been logged out; log in again", "unauthorized",
                                "openai")(send)  # fmt: skip
    cap = MAX_IMAGE_BYTES
    length = _body_length(scope)
    if length is not None and length > cap:
        return await _responder(413, f"an image may be at most {cap >> 20} MB", "too_large",
                                "openai")(send)  # fmt: skip
    if length is None:
        receive, send = _counting(receive, send, cap, "openai")
    return await app(scope, receive, send)


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


SPOOL_BYTES = 4 << 20  # written (and hashed) off the event loop this many bytes at a time


def _write(out, hasher, chunks: list[bytes]) -> None:
    for chunk in chunks:
        hasher.update(chunk)
        out.write(chunk)


async def _streamed(app, scope: dict, receive, send, rule: ApiRule, length: int | None) -> None:
    """A large body into a file in `rule.body_to()` (the module's docstring), then the app."""
    key = await sync_to_async(key_for)(_presented_key(scope) or "")
    if key is None or not key.allows(rule.scope):
        return await _responder(403, f"this needs an API key with the {rule.scope} scope",
                                "insufficient_scope", rule.dialect)(send)  # fmt: skip
    directory = rule.body_to()
    free = shutil.disk_usage(directory).free
    if length and length > free:
        return await _responder(
            507, f"not enough disk space: the body is {length >> 20} MiB and {free >> 20} MiB "
            "is free", "insufficient_storage", rule.dialect,
        )(send)  # fmt: skip
    path = directory / f".body-{uuid.uuid4().hex}.part"
    hasher, size = hashlib.sha256(), 0
    try:
        with open(path, "wb") as out:
            # Held while the body is written: a cleanup (inference.catalog.blobs.prune) leaves
            # it be.
            fcntl.flock(out, fcntl.LOCK_EX)
            pending: list[bytes] = []
            held = 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return  # the client left: nothing to answer, the file goes below
                chunk = message.get("body", b"")
                size += len(chunk)
                if size > rule.cap:
                    return await _too_large(rule.dialect)(send)
                pending.append(chunk)
                held += len(chunk)
                more = message.get("more_body", False)
                if held >= SPOOL_BYTES or not more:
                    await asyncio.to_thread(_write, out, hasher, pending)
                    pending, held = [], 0
                if not more:
                    break
        body = {"path": str(path), "sha256": hasher.hexdigest(), "size": size}
        headers = [(k, v) for k, v in scope.get("headers") or ()
                   if k.lower() not in (b"content-length", b"transfer-encoding")]  # fmt: skip
        inner = {**scope, "headers": [*headers, (b"content-length", b"0")],
                 "appliance.body": body}  # fmt: skip
        delivered = False

        async def empty_receive():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": b"", "more_body": False}
            return await receive()  # the client's disconnect, if it leaves

        await app(inner, empty_receive, send)
    finally:
        path.unlink(missing_ok=True)  # the view moved it into place, or it is not wanted
