"""API keys: who may call the LAN API, with what scope, how often.

Scopes nest: chat (generate, list) < manage (also load, unload and pin models through the Ollama
empty-prompt form, and keep_alive beyond a model's own) < admin (also delete models).

Only the key in a header authenticates: `Authorization: Bearer <key>` (what the openai and ollama
clients send) or `x-api-key: <key>` (what the anthropic client sends), read by `presented_key`
for the views and the gate alike; session cookies never do, so a page a browser visits cannot
ride on a logged-in admin's session, and CSRF does not apply. Keys are looked up by their
SHA-256 hash.

`api_endpoint` is the one declaration of an endpoint's rules: it enforces them in the view and
records them on it as an `EndpointPolicy`, which the gate (appliance.gate) reads to refuse an
anonymous or oversized body before it is read. An endpoint is gated the day it is declared.

`caller_fields` is what a generation takes from who asked, the same for every generation view:
its conversation and partition in the prefix cache, its priority (the key's, or lower if the
request asks: never higher) and its share in fair-share admission (the key's, or one of its
app's users when Open WebUI names them). `granted_keep_alive` is how long a generation may keep
its model loaded: what a manage key asks, at most the model's own for a chat key.
"""

import functools
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TypedDict

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db.models import Q
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from dashboard.api.errors import ApiError, Dialect, invalid
from dashboard.api.ratelimit import get_limiter
from dashboard.models import ApiKey
from inference.catalog.specs import spec_for
from inference.engine.generation import PRIORITIES, Priority
from inference.models import LLMModel

log = logging.getLogger(__name__)

# last_used_at is written at most this often per key: not a database write per request.
LAST_USED_RESOLUTION = timedelta(minutes=1)
MAX_KEY_CHARS = 200

View = Callable[..., Awaitable[HttpResponse]]


@dataclass(frozen=True, slots=True)
class EndpointPolicy:
    """What an API endpoint declares (api_endpoint's arguments), for the view and the gate."""

    dialect: Dialect
    methods: tuple[str, ...]
    scope: str
    public: Callable[[], bool] | None = None  # asked on each request: open without a key?
    # The largest body the gate lets through; None for DATA_UPLOAD_MAX_MEMORY_SIZE, which is also
    # what parse_body (request.body) accepts, so a larger cap needs a view that streams its body.
    max_body: int | None = None
    # Where the gate streams a large body (a blob upload) before the view runs, instead of
    # Django spooling it to the system's temp directory: a directory on the disk it is kept on.
    # The gate checks the key's scope and the free disk there first; the view finds the file
    # and its sha256 in request.scope["appliance.body"] (see appliance.gate).
    body_to: Callable[[], Path] | None = None

    def needs_key(self) -> bool:
        return self.public is None or not self.public()

    def body_cap(self) -> int:
        return settings.DATA_UPLOAD_MAX_MEMORY_SIZE if self.max_body is None else self.max_body


def policy_of(view: Callable) -> EndpointPolicy | None:
    """The policy `view` was declared with by api_endpoint, or None for any other view."""
    return getattr(view, "endpoint_policy", None)


KEY_HEADERS = "'Authorization: Bearer <key>' or 'x-api-key: <key>'"


def presented_key(authorization: str | None, x_api_key: str | None) -> str | None:
    """The key a request presents: its bearer token, else its x-api-key (the anthropic client's
    header); None when it presents neither. The one reading of both headers, for the views
    (api_key_of) and the gate (from the ASGI scope's headers)."""
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return token.strip()
    key = (x_api_key or "").strip()
    return key or None


def api_key_of(request: HttpRequest) -> str | None:
    return presented_key(request.headers.get("Authorization"), request.headers.get("X-Api-Key"))


def key_for(raw: str) -> ApiKey | None:
    """The live key whose secret is `raw`, or None (revoked, unknown, or too long to be one).
    Touches the database: call it from a thread (sync_to_async) on the event loop."""
    if len(raw) > MAX_KEY_CHARS:
        return None
    key = ApiKey.objects.filter(key_hash=ApiKey.hash(raw), revoked=False).first()
    if key is None:
        return None
    now = timezone.now()
    if key.last_used_at is None or now - key.last_used_at >= LAST_USED_RESOLUTION:
        # A conditional update: several processes racing write once, not once each.
        stale = Q(last_used_at__isnull=True) | Q(last_used_at__lte=now - LAST_USED_RESOLUTION)
        ApiKey.objects.filter(stale, pk=key.pk).update(last_used_at=now)
        key.last_used_at = now
    return key


def scope_needed(scope: str) -> str:
    """The scope and the wider ones that include it: "the manage scope (or admin)"."""
    wider = ApiKey.Scope.values[ApiKey.Scope.values.index(scope) + 1 :]
    return f"the {scope} scope" + (f" (or {' or '.join(wider)})" if wider else "")


def require_scope(key: ApiKey, scope: str, action: str = "this") -> None:
    """Raise a 403 unless the key's scope includes `scope` (chat < manage < admin)."""
    if not key.allows(scope):
        raise ApiError(
            403, f"{action} needs an API key with {scope_needed(scope)}; this key has the "
            f"{key.scope} scope", code="insufficient_scope",
        )  # fmt: skip


async def authenticate(request: HttpRequest, scope: str) -> ApiKey:
    """The request's key, checked for scope and rate; raises ApiError (401, 403, 429)."""
    raw = api_key_of(request)
    if raw is None:
        raise ApiError(
            401, f"an API key is required: send the header {KEY_HEADERS}",
            code="missing_api_key", headers={"WWW-Authenticate": 'Bearer realm="appliance"'},
        )  # fmt: skip
    key = await sync_to_async(key_for)(raw)
    if key is None:
        raise ApiError(
            401, "the API key is not valid or has been revoked", code="invalid_api_key",
            headers={"WWW-Authenticate": 'Bearer realm="appliance", error="invalid_token"'},
        )  # fmt: skip
    require_scope(key, scope)
    wait = await get_limiter().hit(key.pk)
    if wait is not None:
        limit = settings.API_RATE_LIMIT_PER_MINUTE
        raise ApiError(
            429, f"rate limit reached: {limit} requests per minute for this key",
            code="rate_limit_exceeded", retry_after=wait,
        )  # fmt: skip
    return key


def api_endpoint(
    *,
    dialect: Dialect,
    methods: tuple[str, ...] = ("GET",),
    scope: str = ApiKey.Scope.CHAT,
    public: Callable[[], bool] | None = None,
    max_body: int | None = None,
    body_to: Callable[[], Path] | None = None,
) -> Callable[[View], View]:
    """Wrap an async view: method check, key check (unless `public()` says it is open), and
    ApiError (or a bug) → the dialect's error response. The key is left on `request.api_key`.
    The same rules are recorded on the view (`policy_of`), with the body cap the gate enforces."""
    policy = EndpointPolicy(dialect, methods, scope, public, max_body, body_to)

    def decorate(view: View) -> View:
        @functools.wraps(view)
        async def wrapper(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            try:
                if request.method not in methods:
                    raise ApiError(
                        405, f"method {request.method} is not allowed here; use "
                        f"{' or '.join(methods)}", headers={"Allow": ", ".join(methods)},
                    )  # fmt: skip
                request.api_key = None
                if policy.needs_key():
                    request.api_key = await authenticate(request, scope)
                return await view(request, *args, **kwargs)
            except ApiError as exc:
                return exc.response(dialect)
            except Exception:
                # A bug, not the client's fault: logged with its traceback, answered in the
                # dialect's own error shape so the client's error handling still works.
                log.exception("%s %s failed", request.method, request.path)
                return ApiError(500, "internal error; the appliance's log has the details",
                                code="internal_error").response(dialect)  # fmt: skip

        endpoint = csrf_exempt(wrapper)
        endpoint.endpoint_policy = policy
        return endpoint

    return decorate


def app_id(request: HttpRequest) -> str:
    """The app behind the request: its key. Its conversation for the prefix cache, and what
    MAX_STREAMS_PER_KEY counts."""
    return f"apikey:{request.api_key.pk}"


# Open WebUI's chat id (a UUID; "local:<id>" for temporary chats), as far as a cache key takes it:
# 96 characters leave room for "apikey:<id>:chat:" within the engine's MAX_ID_CHARS (128).
CHAT_ID_HEADER = "X-OpenWebUI-Chat-Id"
_CHAT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,95}")


def conversation_key(request: HttpRequest) -> str:
    """The request's conversation for the prefix cache: the app's key, narrowed to one chat
    when the app names it (Open WebUI sends X-OpenWebUI-Chat-Id), so its chats keep a slot each
    instead of competing for the app's. Only a hint for which slot to prefer: the KV it may
    reuse is still bounded by cache_partition, which no header changes. A header that is not a
    plain id of at most 96 characters is ignored."""
    base = app_id(request)
    chat = request.headers.get(CHAT_ID_HEADER, "")
    if chat and _CHAT_ID.fullmatch(chat):
        return f"{base}:chat:{chat}"
    return base


def cache_partition(request: HttpRequest) -> str:
    """The prefix-cache partition of the request's API key: an app reuses, and learns about,
    only the KV of its own earlier requests (or its household's, when an admin set one)."""
    return request.api_key.cache_partition


# A request's own ask for a lower priority, in any dialect (Ollama's API has no field for it;
# OpenAI's service_tier "flex" asks the same).
PRIORITY_HEADER = "X-Appliance-Priority"


def lowest(*priorities: Priority) -> Priority:
    """The lowest of some priorities: background below interactive."""
    return max(priorities, key=PRIORITIES.index)


def asked_priority(request: HttpRequest) -> Priority:
    """What the request's X-Appliance-Priority header asks (interactive without one); any other
    value is a 400, so a typo does not quietly run a batch at a person's priority."""
    raw = request.headers.get(PRIORITY_HEADER)
    if raw is None:
        return "interactive"
    value = raw.strip().lower()
    if value not in PRIORITIES:
        raise invalid(f"{PRIORITY_HEADER} must be {' or '.join(PRIORITIES)}, not {raw[:40]!r}",
                      param=PRIORITY_HEADER)  # fmt: skip
    return value


def priority_of(request: HttpRequest, asked: Priority = "interactive") -> Priority:
    """The priority a request runs at: its key's, or lower when the request asks for lower
    (`asked`: its dialect's field, such as service_tier; and the header). Never higher: an
    app whose key an admin marked background cannot ask its way in front of people."""
    return lowest(request.api_key.priority, asked, asked_priority(request))


# Open WebUI's user, sent with ENABLE_FORWARD_USER_INFO_HEADERS (its ids are UUIDs).
USER_ID_HEADER = "X-OpenWebUI-User-Id"
_USER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def share_of(request: HttpRequest) -> str:
    """Whose turn the request takes in fair-share admission: its app ("apikey:<id>"), narrowed
    to one of the app's users when Open WebUI names them ("apikey:<id>:user:<uid>"), so the
    people behind one Open WebUI take turns as people on the chat page do. The header is the
    app's word, not proof: the share always starts with the app's own key (a header cannot
    take another app's turn, and admission can weigh apps before their users), and the app's
    answers at once stay capped by MAX_STREAMS_PER_KEY. A header that is not a plain id of at
    most 64 characters is ignored."""
    base = app_id(request)
    user = request.headers.get(USER_ID_HEADER, "")
    if user and _USER_ID.fullmatch(user):
        return f"{base}:user:{user}"
    return base


class CallerFields(TypedDict):
    cache_key: str
    cache_partition: str
    priority: Priority
    share: str


def caller_fields(request: HttpRequest, *, asked: Priority = "interactive") -> CallerFields:
    """What a generation's request takes from who asked (inference.catalog.specs.request_for's
    fields), the same for every generation view: `asked` is the priority its body asks for."""
    return CallerFields(
        cache_key=conversation_key(request),
        cache_partition=cache_partition(request),
        priority=priority_of(request, asked),
        share=share_of(request),
    )


def granted_keep_alive(api_key: ApiKey, model: LLMModel, asked: float | None) -> float | None:
    """The keep_alive a generation runs with. A manage or admin key's is used as sent. A chat
    key's is clamped to the model's own keep-alive (its page, else DEFAULT_KEEP_ALIVE): shorter
    (0 included) is kept, as it only frees memory sooner, which asking for another model can do
    anyway; longer or negative (pin for ever) becomes the model's own, so that one app cannot
    hold the memory every app shares. Clamped, not refused: Home Assistant's Ollama integration
    sends keep_alive -1 with every request, and its calls must keep working on a chat key."""
    if asked is None or api_key.allows(ApiKey.Scope.MANAGE):
        return asked
    own = spec_for(model).keep_alive
    if own < 0 or 0 <= asked <= own:
        return asked
    log.debug("keep_alive %s from chat key %s clamped to %s's own %s s",
              asked, api_key.name, model.name, own)  # fmt: skip
    return None  # the model's own keep-alive
