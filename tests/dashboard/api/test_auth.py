"""Who may call the LAN API: keys (missing, wrong, revoked), scopes, session cookies, and the
per-key rate limit and the engine's bounded queue, both answered 429 with Retry-After."""

import concurrent.futures
import json
import threading
import time

import httpx
import pytest

from tests.dashboard.api.conftest import RATE_LIMIT
from tests.dashboard.api.server import BUSY_KEYS, STARTER, read_json

# (method, path, body, dialect)
ENDPOINTS = [
    ("GET", "/v1/models", None, "openai"),
    ("GET", f"/v1/models/{STARTER}", None, "openai"),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}, "openai"),
    ("POST", "/v1/completions", {"prompt": "x"}, "openai"),
    ("POST", "/v1/responses", {"input": "x"}, "openai"),
    ("GET", "/metrics", None, "openai"),
    ("GET", "/api/tags", None, "ollama"),
    ("GET", "/api/ps", None, "ollama"),
    ("GET", "/api/version", None, "ollama"),
    ("POST", "/api/show", {"model": STARTER}, "ollama"),
    ("POST", "/api/chat", {"model": STARTER, "messages": []}, "ollama"),
    ("POST", "/api/generate", {"model": STARTER, "prompt": ""}, "ollama"),
    ("DELETE", "/api/delete", {"model": "no-such-model"}, "ollama"),
    ("POST", "/api/pull", {"model": "no-such-model"}, "ollama"),
    ("POST", "/api/create", {"model": "made", "from": STARTER}, "ollama"),
    ("POST", "/api/copy", {"source": STARTER, "destination": "copied"}, "ollama"),
    ("POST", "/api/push", {"model": STARTER}, "ollama"),
    ("POST", f"/api/blobs/sha256:{'0' * 64}", {"not": "a blob"}, "ollama"),
    ("POST", "/v1/embeddings", {"model": STARTER, "input": "x"}, "openai"),
    ("POST", "/api/embed", {"model": STARTER, "input": "x"}, "ollama"),
    ("POST", "/api/embeddings", {"model": STARTER, "prompt": "x"}, "ollama"),
    ("POST", "/v1/messages", {"max_tokens": 1, "messages": [{"role": "user", "content": "x"}]},
     "anthropic"),
    ("POST", "/v1/messages/count_tokens", {"messages": [{"role": "user", "content": "x"}]},
     "anthropic"),
    ("POST", "/tokenize", {"content": "x"}, "openai"),
    ("POST", "/detokenize", {"tokens": [1]}, "openai"),
    ("POST", "/apply-template", {"messages": [{"role": "user", "content": "x"}]}, "openai"),
    ("POST", "/completion", {"prompt": "x"}, "openai"),
    ("POST", "/infill", {"input_prefix": "x", "input_suffix": "y"}, "openai"),
    ("GET", "/props", None, "openai"),
    ("POST", "/v1/rerank", {"query": "x", "documents": ["y"]}, "openai"),
    ("POST", "/v1/reranking", {"query": "x", "documents": ["y"]}, "openai"),
    ("POST", "/rerank", {"query": "x", "documents": ["y"]}, "openai"),
    ("POST", "/reranking", {"query": "x", "texts": ["y"]}, "openai"),
]  # fmt: skip
IDS = [f"{method} {path}" for method, path, _, _ in ENDPOINTS]


def call(http: httpx.Client, method: str, path: str, body, headers=None) -> httpx.Response:
    return http.request(method, path, json=body, headers=headers or {})


def assert_error(response: httpx.Response, status: int, dialect: str) -> dict:
    assert response.status_code == status, response.text
    body = read_json(response)
    if dialect == "openai":
        assert {"message", "type", "param", "code"} <= body["error"].keys()
    elif dialect == "anthropic":
        assert body["type"] == "error" and {"type", "message"} <= body["error"].keys()
    else:
        assert isinstance(body["error"], str) and body["error"]
    return body


def test_the_list_above_holds_every_route_that_needs_a_key():
    from django.urls import resolve

    from tests.appliance.routes import api_routes

    keyed = {resolve(r.path).route for r in api_routes()
             if r.path and r.policy is not None and r.policy.needs_key()}  # fmt: skip
    listed = {resolve(path).route for _, path, _, _ in ENDPOINTS}
    assert keyed <= listed, f"add these to ENDPOINTS: {sorted(keyed - listed)}"


@pytest.mark.parametrize(("method", "path", "body", "dialect"), ENDPOINTS, ids=IDS)
def test_every_endpoint_refuses_a_request_without_a_key(http, method, path, body, dialect):
    response = call(http, method, path, body)
    assert_error(response, 401, dialect)
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("method", "path", "body", "dialect"), ENDPOINTS, ids=IDS)
def test_every_endpoint_refuses_a_wrong_or_revoked_key(
    http, appliance, method, path, body, dialect
):
    for headers in (
        {"Authorization": "Bearer hla-not-a-real-key"},
        appliance.headers("revoked-app"),
        {"Authorization": f"Basic {appliance.keys['chat-app']}"},
    ):
        assert_error(call(http, method, path, body, headers), 401, dialect)


def test_the_openapi_description_needs_no_key(http):
    response = http.get("/api/openapi.json")
    assert response.status_code == 200
    assert response.json()["openapi"].startswith("3.")


def test_a_chat_key_may_not_delete_a_model(http, chat_headers):
    response = call(http, "DELETE", "/api/delete", {"model": STARTER}, chat_headers)
    assert_error(response, 403, "ollama")
    assert STARTER in [
        m["name"].split(":")[0]
        for m in http.get("/api/tags", headers=chat_headers).json()["models"]
    ]


def test_a_logged_in_session_is_not_an_api_key(appliance):
    with httpx.Client(base_url=appliance.url, timeout=30) as browser:
        browser.get("/login/")
        token = browser.cookies["csrftoken"]
        login = browser.post(
            "/login/",
            data={"username": "admin", "password": "pw-admin-test-1", "csrfmiddlewaretoken": token},
            headers={"Referer": f"{appliance.url}/login/"},
        )
        assert login.status_code == 302 and "sessionid" in browser.cookies
        assert_error(browser.get("/v1/models"), 401, "openai")
        assert_error(
            browser.post("/api/show", json={"model": STARTER}, headers={"X-CSRFToken": token}),
            401,
            "ollama",
        )


def test_a_wrong_method_is_refused_in_the_apis_format(http, chat_headers):
    response = http.get("/v1/chat/completions", headers=chat_headers)
    assert_error(response, 405, "openai")
    assert response.headers["Allow"] == "POST"


def test_a_used_key_records_when_it_was_last_used(http, appliance):
    assert http.get("/api/tags", headers=appliance.headers("chat-app")).status_code == 200
    out = appliance.shell(
        "from dashboard.models import ApiKey\n"
        "for key in ApiKey.objects.filter(name__in=['chat-app', 'busy-7']):\n"
        "    print('USED', key.name, key.last_used_at is not None)\n"
    )
    used = dict(line.split()[1:] for line in out.splitlines() if line.startswith("USED"))
    assert used == {"chat-app": "True", "busy-7": "False"}


def test_past_the_rate_limit_a_key_gets_429_with_retry_after(limited_appliance):
    app = limited_appliance
    with httpx.Client(base_url=app.url, timeout=30) as http:
        for key, path, dialect in (
            ("openai-limited", "/v1/models", "openai"),
            ("ollama-limited", "/api/tags", "ollama"),
        ):
            headers = app.headers(key)
            for _ in range(RATE_LIMIT):
                assert http.get(path, headers=headers).status_code == 200
            refused = http.get(path, headers=headers)
            body = assert_error(refused, 429, dialect)
            assert 1 <= int(refused.headers["Retry-After"]) <= 60
            if dialect == "openai":
                assert body["error"]["type"] == "rate_limit_error"
        # Another key has its own window.
        assert http.get("/api/tags", headers=app.headers("chat-app")).status_code == 200


@pytest.mark.model
def test_a_full_engine_queue_answers_429_at_once_instead_of_hanging(limited_appliance):
    """The limited server runs ENGINE_MAX_QUEUE=1: with 4 sequence slots and a queue of one,
    at most 5 of 6 long answers can be under way at once; the others are refused as busy."""
    app = limited_appliance
    body = {
        "model": STARTER,
        "prompt": "1, 2, 3, 4, 5,",
        "max_tokens": 400,
        "temperature": 0,
        "stream": True,
    }
    stop = threading.Event()
    answers: dict[str, tuple[int, dict, str]] = {}

    def ask(key: str) -> None:
        with (
            httpx.Client(base_url=app.url, timeout=120) as http,
            http.stream("POST", "/v1/completions", json=body, headers=app.headers(key)) as response,
        ):
            text = "" if response.status_code == 200 else response.read().decode()
            answers[key] = (response.status_code, dict(response.headers), text)
            if response.status_code == 200:
                stop.wait(120)  # hold the answer open; leaving cancels it

    keys = BUSY_KEYS[:6]
    with concurrent.futures.ThreadPoolExecutor(len(keys)) as pool:
        futures = [pool.submit(ask, key) for key in keys]
        try:
            deadline = time.monotonic() + 180
            while len(answers) < len(keys) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert len(answers) == len(keys), "every request gets an answer: none hangs"
        finally:
            stop.set()
            for future in futures:
                future.result(timeout=120)
    refused = [(headers, text) for status, headers, text in answers.values() if status == 429]
    assert refused and len(refused) + sum(s == 200 for s, _, _ in answers.values()) == 6
    for headers, text in refused:
        assert int(headers["retry-after"]) >= 1
        assert json.loads(text)["error"]["code"] == "engine_busy"
    assert sum(status == 200 for status, _, _ in answers.values()) <= 5
