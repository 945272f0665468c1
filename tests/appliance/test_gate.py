"""The body gate (appliance.gate) in process: it answers from the headers alone, never reading
a body it refuses, lets everything else through untouched, and stamps each request's arrival."""

import asyncio
import json
import time
import types
from pathlib import Path

import pytest
from django.core.asgi import get_asgi_application

from appliance.arrival import ARRIVED_PERF, ARRIVED_WALL
from appliance.gate import ApiRule, BodyGate, api_rule
from dashboard.api.auth import api_endpoint
from tests.appliance.routes import api_routes, keyed_body_routes

FIFTY_MB = 50 * 1024 * 1024


class Recorder:
    """An inner application that records what reached it, answering 200."""

    def __init__(self):
        self.scopes: list[dict] = []
        self.received: list[dict] = []

    async def __call__(self, scope, receive, send):
        self.scopes.append(scope)
        if scope["type"] == "http":
            while True:
                message = await receive()
                self.received.append(message)
                if message["type"] == "http.disconnect" or not message.get("more_body"):
                    break
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})


def http_scope(method: str, path: str, headers: dict[str, str]) -> dict:
    return {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": method,
        "path": path, "raw_path": path.encode(), "root_path": "", "scheme": "http",
        "query_string": b"", "client": ["127.0.0.1", 50000], "server": ["127.0.0.1", 8000],
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }  # fmt: skip


async def never_read():
    raise AssertionError("the gate read the body of a request it refuses")


async def call(app, scope, receive=never_read) -> list[dict]:
    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    await asyncio.wait_for(app(scope, receive, send), 10)
    return sent


def status_of(sent: list[dict]) -> int:
    return sent[0]["status"]


def header(sent: list[dict], name: bytes) -> bytes | None:
    return dict(sent[0]["headers"]).get(name)


@pytest.mark.parametrize("route", keyed_body_routes(), ids=str)
async def test_an_anonymous_body_gets_a_401_before_a_byte_is_read(route):
    """Every route whose view declares a key, read from the URL resolver: one added later is
    in this test the day it is declared."""
    inner = Recorder()
    for auth in ({}, {"Authorization": "Basic abc"}, {"Authorization": "Bearer "}):
        sent = await call(BodyGate(inner), http_scope(route.method, route.path, {
            "Content-Type": "application/json", "Content-Length": str(FIFTY_MB), **auth,
        }))  # fmt: skip
        assert status_of(sent) == 401
        assert header(sent, b"www-authenticate").startswith(b"Bearer")
        error = json.loads(sent[1]["body"])["error"]
        if route.policy.dialect == "openai":
            assert error["code"] == "missing_api_key" and error["type"] == "authentication_error"
        elif route.policy.dialect == "anthropic":
            assert error["type"] == "authentication_error" and "API key" in error["message"]
        else:
            assert "API key is required" in error
    assert inner.scopes == []


def test_the_routes_that_were_missing_from_the_gates_old_list_are_keyed():
    keyed = {str(route) for route in keyed_body_routes()}
    assert {"POST /v1/embeddings", "POST /api/embed", "POST /api/embeddings",
            "POST /api/pull", "POST /api/create"} <= keyed  # fmt: skip


def test_the_tokenizer_and_messages_routes_are_keyed():
    keyed = {str(route) for route in keyed_body_routes()}
    assert {"POST /v1/messages", "POST /v1/messages/count_tokens", "POST /tokenize",
            "POST /detokenize", "POST /apply-template"} <= keyed  # fmt: skip


def test_every_api_route_a_path_can_name_declares_its_policy():
    """The gate judges what a view declares: a view without a declaration would be neither
    keyed nor capped by it. Only the catch-alls of unknown paths (re_path) declare nothing."""
    for route in api_routes():
        if route.path is None:
            assert route.policy is None, f"{route.pattern}: declare it with path(), not re_path()"
        else:
            assert route.policy is not None, f"{route.path}: declare it with @api_endpoint"


@pytest.mark.django_db(transaction=True)
async def test_an_unknown_key_is_refused_at_the_gate_and_a_known_one_over_the_cap_gets_413():
    from asgiref.sync import sync_to_async

    from dashboard.models import ApiKey

    _, raw = await sync_to_async(ApiKey.create)("gate-app")
    inner = Recorder()
    headers = {"Content-Type": "application/json", "Content-Length": str(FIFTY_MB)}
    sent = await call(BodyGate(inner), http_scope(
        "POST", "/v1/chat/completions", {**headers, "Authorization": "Bearer hla-made-up"}
    ))  # fmt: skip
    assert status_of(sent) == 401 and b"invalid_api_key" in sent[1]["body"]
    sent = await call(BodyGate(inner), http_scope(
        "POST", "/v1/chat/completions", {**headers, "Authorization": f"Bearer {raw}"}
    ))  # fmt: skip
    assert status_of(sent) == 413 and b"request_too_large" in sent[1]["body"]
    assert inner.scopes == []


@pytest.mark.django_db(transaction=True)
async def test_the_gate_reads_the_key_from_x_api_key_as_the_views_do():
    """The anthropic client sends its key as x-api-key: the gate lets a known one through and
    refuses an unknown one, in Anthropic's error shape for /v1/messages."""
    from asgiref.sync import sync_to_async

    from dashboard.models import ApiKey

    _, raw = await sync_to_async(ApiKey.create)("gate-anthropic-app")
    inner = Recorder()
    headers = {"Content-Type": "application/json", "Content-Length": str(FIFTY_MB)}
    sent = await call(BodyGate(inner), http_scope(
        "POST", "/v1/messages", {**headers, "x-api-key": "hla-made-up"}
    ))  # fmt: skip
    assert status_of(sent) == 401
    assert json.loads(sent[1]["body"]) == {"type": "error", "error": {
        "type": "authentication_error", "message": "the API key is not valid or has been revoked",
    }}  # fmt: skip
    sent = await call(BodyGate(inner), http_scope(
        "POST", "/v1/messages", {**headers, "x-api-key": raw}
    ))  # fmt: skip
    assert status_of(sent) == 413  # past the key: the cap
    assert json.loads(sent[1]["body"])["error"]["type"] == "request_too_large"
    assert inner.scopes == []


async def test_an_anonymous_upload_is_sent_to_sign_in_before_a_byte_is_read():
    inner = Recorder()
    sent = await call(BodyGate(inner), http_scope("POST", "/models/upload/", {
        "Content-Type": "multipart/form-data; boundary=x", "Content-Length": str(200 << 20),
    }))  # fmt: skip
    assert status_of(sent) == 302
    assert header(sent, b"location") == b"/login/?next=/models/upload/"
    assert inner.scopes == []


async def test_an_anonymous_projector_upload_is_sent_to_sign_in_before_a_byte_is_read():
    inner = Recorder()
    sent = await call(BodyGate(inner), http_scope("POST", "/models/smollm2/projector/", {
        "Content-Type": "multipart/form-data; boundary=x", "Content-Length": str(200 << 20),
    }))  # fmt: skip
    assert status_of(sent) == 302
    assert header(sent, b"location") == b"/login/?next=/models/smollm2/projector/"
    assert inner.scopes == []


async def test_an_upload_with_a_session_cookie_goes_on_to_the_view():
    inner = Recorder()

    async def body():
        return {"type": "http.request", "body": b"x", "more_body": False}

    sent = await call(BodyGate(inner), http_scope("POST", "/models/upload/", {
        "Content-Length": str(200 << 20), "Cookie": "csrftoken=a; sessionid=abc",
    }), body)  # fmt: skip
    assert status_of(sent) == 200 and len(inner.scopes) == 1


async def test_a_chat_picture_over_the_cap_is_refused_before_a_byte_is_read():
    from dashboard.chat.images import MAX_IMAGE_BYTES

    inner = Recorder()
    sent = await call(BodyGate(inner), http_scope("POST", "/chat/images/", {
        "Content-Type": "image/jpeg", "Content-Length": str(MAX_IMAGE_BYTES + 1),
        "Cookie": "csrftoken=a; sessionid=abc",
    }))  # fmt: skip
    assert status_of(sent) == 413
    assert "at most 20 MB" in json.loads(sent[1]["body"])["error"]["message"]
    assert inner.scopes == []


async def test_a_chat_picture_without_a_session_is_refused_before_a_byte_is_read():
    inner = Recorder()
    sent = await call(BodyGate(inner), http_scope("POST", "/chat/images/", {
        "Content-Type": "image/png", "Content-Length": "1000",
    }))  # fmt: skip
    assert status_of(sent) == 401
    assert inner.scopes == []


async def test_a_chunked_chat_picture_is_cut_off_at_the_cap(monkeypatch):
    from appliance import gate

    monkeypatch.setattr(gate, "MAX_IMAGE_BYTES", 1000)
    inner = Recorder()

    async def body():
        return {"type": "http.request", "body": b"x" * 300, "more_body": True}

    sent = await call(BodyGate(inner), http_scope("POST", "/chat/images/", {
        "Transfer-Encoding": "chunked", "Cookie": "sessionid=abc",
    }), body)  # fmt: skip
    assert [status_of(sent), len(sent)] == [413, 2]
    assert inner.received[-1] == {"type": "http.disconnect"}


async def test_a_chat_picture_within_the_cap_goes_on_to_the_view():
    inner = Recorder()

    async def body():
        return {"type": "http.request", "body": b"x", "more_body": False}

    sent = await call(BodyGate(inner), http_scope("POST", "/chat/images/", {
        "Content-Length": "1", "Cookie": "sessionid=abc",
    }), body)  # fmt: skip
    assert status_of(sent) == 200 and len(inner.scopes) == 1


@pytest.mark.parametrize(
    ("method", "path"),
    [("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/no-such-endpoint"),
     ("POST", "/api/no/such/thing"), ("POST", "/api/openapi.json"), ("POST", "/login/"),
     ("GET", "/api/tags")],
)  # fmt: skip
async def test_what_the_gate_does_not_judge_passes_through(method, path):
    """Bodiless calls (Django answers 401/405 without a body to read), unknown API paths (their
    JSON 404: no view declares them), the public description and the pages are the views' to
    answer."""
    inner = Recorder()
    headers = {"Content-Length": "2"} if method == "POST" else {}

    async def body():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    sent = await call(BodyGate(inner), http_scope(method, path, headers), body)
    assert status_of(sent) == 200 and len(inner.scopes) == 1


@pytest.fixture
def raw_key(transactional_db) -> str:
    from dashboard.models import ApiKey

    return ApiKey.create("gate-app")[1]


async def test_a_chunked_body_over_the_cap_is_cut_off_with_413(settings, raw_key):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    inner = Recorder()
    chunks = iter(range(100))

    async def body():
        next(chunks)
        return {"type": "http.request", "body": b"x" * 300, "more_body": True}

    sent = await call(BodyGate(inner), http_scope("POST", "/v1/embeddings", {
        "Transfer-Encoding": "chunked", "Authorization": f"Bearer {raw_key}",
    }), body)  # fmt: skip
    assert [status_of(sent), len(sent)] == [413, 2]  # the app's own answer never went out
    assert inner.received[-1] == {"type": "http.disconnect"}
    assert sum(len(m.get("body", b"")) for m in inner.received) <= 1200


async def test_a_chunked_body_under_the_cap_reaches_the_app(raw_key):
    inner = Recorder()
    parts = [b'{"a":', b"1}"]

    async def body():
        return {"type": "http.request", "body": parts.pop(0), "more_body": bool(parts)}

    sent = await call(BodyGate(inner), http_scope(
        "POST", "/v1/embeddings", {"Transfer-Encoding": "chunked",
                                   "Authorization": f"Bearer {raw_key}"}
    ), body)  # fmt: skip
    assert status_of(sent) == 200
    assert b"".join(m["body"] for m in inner.received) == b'{"a":1}'


@api_endpoint(dialect="openai", methods=("POST",))
async def _brand_new(request):
    raise AssertionError("the gate let an anonymous body through")


@api_endpoint(dialect="ollama", methods=("POST",), public=lambda: True, max_body=100)
async def _open_and_small(request):
    raise AssertionError("never called: the inner application is a Recorder")


def _plain(request):
    raise AssertionError("never called: the inner application is a Recorder")


@pytest.fixture
def new_routes(settings):
    """A URLconf of views the gate has never heard of: nothing lists them anywhere."""
    from django.urls import path

    urls = types.ModuleType("brand_new_urls")
    urls.urlpatterns = [
        path("v1/brand-new", _brand_new), path("api/open-and-small", _open_and_small),
        path("v1/undeclared", _plain),
    ]  # fmt: skip
    settings.ROOT_URLCONF = urls
    return urls


async def test_a_newly_declared_endpoint_is_gated_without_editing_a_list(new_routes, settings):
    assert api_rule("/v1/brand-new") == ApiRule(
        "openai", keyed=True, cap=settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    )
    assert api_rule("/api/open-and-small") == ApiRule("ollama", keyed=False, cap=100)
    inner = Recorder()
    sent = await call(BodyGate(inner), http_scope("POST", "/v1/brand-new", {
        "Content-Length": str(FIFTY_MB)}))  # fmt: skip
    assert status_of(sent) == 401 and b"missing_api_key" in sent[1]["body"]
    sent = await call(BodyGate(inner), http_scope("POST", "/api/open-and-small", {
        "Content-Length": "101"}))  # fmt: skip
    assert status_of(sent) == 413 and json.loads(sent[1]["body"]) == {
        "error": "the request body is too large"}  # fmt: skip
    assert inner.scopes == []


@pytest.mark.parametrize(("path", "length"), [("/api/open-and-small", 100), ("/v1/undeclared", 2)])
async def test_a_public_body_within_its_cap_and_an_undeclared_view_pass(new_routes, path, length):
    inner = Recorder()

    async def body():
        return {"type": "http.request", "body": b"x" * length, "more_body": False}

    sent = await call(BodyGate(inner), http_scope("POST", path, {
        "Content-Length": str(length)}), body)  # fmt: skip
    assert status_of(sent) == 200 and len(inner.scopes) == 1


async def test_metrics_is_keyed_unless_metrics_public(settings):
    settings.METRICS_PUBLIC = False
    assert api_rule("/metrics").keyed
    settings.METRICS_PUBLIC = True
    assert not api_rule("/metrics").keyed
    assert not api_rule("/api/openapi.json").keyed


async def test_websockets_pass_untouched():
    inner = Recorder()
    scope = {"type": "websocket", "path": "/ws/chat/", "headers": []}
    await call(BodyGate(inner), scope)
    assert inner.scopes == [scope] and inner.scopes[0] is scope


async def test_the_arrival_is_stamped_into_the_scope():
    inner = Recorder()

    async def body():
        return {"type": "http.request", "body": b"", "more_body": False}

    before_wall, before_perf = time.time(), time.perf_counter()
    await call(BodyGate(inner), http_scope("GET", "/healthz", {}), body)
    scope = inner.scopes[0]
    assert before_wall <= scope[ARRIVED_WALL] <= time.time()
    assert before_perf <= scope[ARRIVED_PERF] <= time.perf_counter()


async def test_django_behind_the_gate_still_answers():
    messages = [{"type": "http.request", "body": b""}]

    async def receive():
        if messages:
            return messages.pop()
        await asyncio.sleep(30)  # the client stays until the answer is sent
        return {"type": "http.disconnect"}

    sent = await call(BodyGate(get_asgi_application()), http_scope("GET", "/healthz", {}), receive)
    assert status_of(sent) in (200, 503)


def test_a_blob_upload_may_be_far_larger_than_a_json_body(settings):
    rule = api_rule("/api/blobs/sha256:" + "0" * 64)
    assert rule == ApiRule("ollama", keyed=True, cap=settings.MAX_BLOB_BYTES)
    assert rule.cap > 1000 * settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    assert api_rule("/api/create").cap == settings.DATA_UPLOAD_MAX_MEMORY_SIZE


BLOB = "/api/blobs/sha256:" + "0" * 64


def body_of(*chunks: bytes):
    messages = iter([{"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
                     for i, c in enumerate(chunks)])  # fmt: skip

    async def receive():
        return next(messages, {"type": "http.disconnect"})

    return receive


@pytest.mark.django_db(transaction=True)
async def test_a_blob_body_is_streamed_to_the_models_disk_by_the_gate(settings, tmp_path):
    """The gate writes a blob upload into the blobs directory, hashed, and hands the view an
    empty body and the file; what the view did not keep is removed after it."""
    import hashlib

    from asgiref.sync import sync_to_async

    from dashboard.models import ApiKey

    settings.MODELS_DIR = tmp_path
    _, admin = await sync_to_async(ApiKey.create)("gate-admin", "admin")
    _, chat = await sync_to_async(ApiKey.create)("gate-chat")
    inner = Recorder()
    headers = {"Content-Length": "6"}
    as_chat = http_scope("POST", BLOB, {**headers, "Authorization": f"Bearer {chat}"})
    sent = await call(BodyGate(inner), as_chat)
    assert status_of(sent) == 403 and inner.scopes == []
    seen = {}

    class Keeps(Recorder):
        async def __call__(self, scope, receive, send):
            seen.update(scope["appliance.body"])
            seen["there"] = Path(seen["path"]).read_bytes()
            await super().__call__(scope, receive, send)

    keeps = Keeps()
    as_admin = http_scope("POST", BLOB, {**headers, "Authorization": f"Bearer {admin}"})
    sent = await call(BodyGate(keeps), as_admin, body_of(b"abc", b"def"))
    assert status_of(sent) == 200
    assert seen["there"] == b"abcdef" and seen["size"] == 6
    assert seen["sha256"] == hashlib.sha256(b"abcdef").hexdigest()
    assert keeps.received == [{"type": "http.request", "body": b"", "more_body": False}]
    assert dict(keeps.scopes[0]["headers"])[b"content-length"] == b"0"
    assert not Path(seen["path"]).exists()


@pytest.mark.django_db(transaction=True)
async def test_a_blob_larger_than_the_free_disk_gets_507_before_a_byte_is_read(
    settings, tmp_path, monkeypatch
):
    from asgiref.sync import sync_to_async

    from dashboard.models import ApiKey

    settings.MODELS_DIR = tmp_path
    full = types.SimpleNamespace(free=999)
    monkeypatch.setattr("appliance.gate.shutil.disk_usage", lambda _: full)
    _, admin = await sync_to_async(ApiKey.create)("gate-admin", "admin")
    inner = Recorder()
    sent = await call(BodyGate(inner), http_scope("POST", BLOB, {
        "Content-Length": "1000", "Authorization": f"Bearer {admin}"}))  # fmt: skip
    assert status_of(sent) == 507 and b"disk space" in sent[1]["body"]
    assert inner.scopes == []
