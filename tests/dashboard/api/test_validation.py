"""Every field is bounds-checked before anything reaches the engine: an out-of-range, mistyped
or unsupported value is a 400 that names the field, never a crash or a silent default."""

import pytest

from tests.dashboard.api.server import STARTER, read_json

USER = {"role": "user", "content": "hi"}
CHAT = {"model": STARTER, "messages": [USER], "max_tokens": 2}

# (what is wrong, the fields to send, the field the error names)
OPENAI_CASES = [
    ("temperature below 0", {"temperature": -1}, "temperature"),
    ("temperature far above 2", {"temperature": 99}, "temperature"),
    ("top_p above 1", {"top_p": 2}, "top_p"),
    ("max_tokens 0", {"max_tokens": 0}, "max_tokens"),
    ("max_tokens absurd", {"max_tokens": 10**9}, "max_tokens"),
    ("max_completion_tokens negative", {"max_completion_tokens": -5}, "max_completion_tokens"),
    ("seed negative", {"seed": -1}, "seed"),
    ("seed too big", {"seed": 2**64}, "seed"),
    ("n 9", {"n": 9}, "n"),
    ("logit_bias on a word", {"logit_bias": {"hello": 5}}, "logit_bias"),
    ("stop with 100 entries", {"stop": ["x"] * 100}, "stop"),
    ("an empty stop string", {"stop": [""]}, "stop.0"),
    ("presence penalty 3", {"presence_penalty": 3}, "presence_penalty"),
    ("frequency penalty -3", {"frequency_penalty": -3}, "frequency_penalty"),
    ("no messages", {"messages": []}, "messages"),
    ("an unknown role", {"messages": [{"role": "wizard", "content": "hi"}]}, "messages.0.role"),
    ("a number as text", {"temperature": "0.5"}, "temperature"),
    ("true as a number", {"max_tokens": True}, "max_tokens"),
    ("an unknown response_format", {"response_format": {"type": "xml"}}, "response_format.type"),
    (
        "a schema keyword the grammar cannot enforce",
        {"response_format": {"type": "json_schema",
                             "json_schema": {"name": "x", "schema": {"not": {}}}}},
        "response_format.json_schema.schema",
    ),  # fmt: skip
    ("top_logprobs above 20", {"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ("top_logprobs without logprobs", {"top_logprobs": 3}, "top_logprobs"),
    ("logprobs as a number", {"logprobs": 5}, "logprobs"),
    ("a forced tool", {"tool_choice": "required"}, "tool_choice"),
    (
        "a content too long",
        {"messages": [{"role": "user", "content": "x" * 300_000}]},
        "messages.0.content",
    ),
    (
        "an image URL that is no base64 data: URL",
        {
            "messages": [
                {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:,"}}]}
            ]
        },
        "messages.0.content",
    ),
    (
        "a bad tool name",
        {"tools": [{"type": "function", "function": {"name": "no spaces"}}]},
        "tools.0.function.name",
    ),
]


@pytest.mark.parametrize(
    ("fields", "param"), [c[1:] for c in OPENAI_CASES], ids=[c[0] for c in OPENAI_CASES]
)
def test_an_invalid_chat_field_is_a_400_naming_it(http, chat_headers, fields, param):
    response = http.post("/v1/chat/completions", json={**CHAT, **fields}, headers=chat_headers)
    assert response.status_code == 400, response.text
    error = read_json(response)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert error["message"].startswith(param)


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity", "1e999"])
def test_a_non_finite_number_is_a_400(http, chat_headers, value):
    raw = f'{{"messages": [{{"role": "user", "content": "hi"}}], "top_p": {value}}}'
    response = http.post(
        "/v1/chat/completions",
        content=raw.encode(),
        headers={**chat_headers, "Content-Type": "application/json"},
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "top_p"


COMPLETION_CASES = [
    ("two prompts", {"prompt": ["a", "b"]}, "prompt"),
    ("token ids", {"prompt": [1, 2, 3]}, "prompt"),
    ("echo", {"echo": True}, "echo"),
    ("best_of 3", {"best_of": 3}, "best_of"),
    ("logprobs above 20", {"logprobs": 21}, "logprobs"),
    ("logprobs negative", {"logprobs": -1}, "logprobs"),
    ("no prompt", {"prompt": None}, "prompt"),
]


@pytest.mark.parametrize(
    ("fields", "param"), [c[1:] for c in COMPLETION_CASES], ids=[c[0] for c in COMPLETION_CASES]
)
def test_an_invalid_completion_field_is_a_400(http, chat_headers, fields, param):
    body = {"model": STARTER, "prompt": "x", "max_tokens": 2, **fields}
    response = http.post("/v1/completions", json=body, headers=chat_headers)
    assert response.status_code == 400, response.text
    assert read_json(response)["error"]["param"] == param


OLLAMA_CASES = [
    ("temperature -1", {"options": {"temperature": -1}}),
    ("num_predict 0", {"options": {"num_predict": 0}}),
    ("num_predict absurd", {"options": {"num_predict": 10**9}}),
    ("top_k negative", {"options": {"top_k": -3}}),
    ("seed -2", {"options": {"seed": -2}}),
    ("repeat_last_n -5", {"options": {"repeat_last_n": -5}}),
    ("stop with 100 entries", {"options": {"stop": ["x"] * 100}}),
    ("format yaml", {"format": "yaml"}),
    ("a JSON schema the grammar cannot enforce", {"format": {"type": "integer", "maximum": 3}}),
    ("think", {"think": True}),
    ("top_logprobs above 20", {"logprobs": True, "top_logprobs": 21}),
    ("top_logprobs without logprobs", {"top_logprobs": 2}),
    ("a bad keep_alive", {"keep_alive": "soon"}),
    ("an unknown role", {"messages": [{"role": "wizard", "content": "x"}]}),
    ("an image that is no picture", {"messages": [{"role": "user", "content": "x",
                                                    "images": ["aGk="]}]}),
    ("no model", {"model": ""}),
    ("messages not a list", {"messages": "hi"}),
]


@pytest.mark.parametrize("fields", [c[1] for c in OLLAMA_CASES], ids=[c[0] for c in OLLAMA_CASES])
def test_an_invalid_ollama_chat_field_is_a_400(http, chat_headers, fields):
    body = {"model": STARTER, "messages": [USER], "stream": False, **fields}
    response = http.post("/api/chat", json=body, headers=chat_headers)
    assert response.status_code == 400, response.text
    error = read_json(response)["error"]
    assert isinstance(error, str) and error


@pytest.mark.parametrize(
    "fields",
    [{"template": "{{ .Prompt }}"}, {"suffix": "end"}, {"context": [1, 2]}, {"images": ["aGk="]}],
)
def test_generate_refuses_what_it_cannot_honour(http, chat_headers, fields):
    body = {"model": STARTER, "prompt": "x", "stream": False, **fields}
    assert http.post("/api/generate", json=body, headers=chat_headers).status_code == 400


@pytest.mark.parametrize("raw", [b"", b"{not json", b"[1, 2]", b'"text"', b"{" * 100_000])
def test_a_body_that_is_not_a_json_object_is_a_400(http, chat_headers, raw):
    for path in ("/v1/chat/completions", "/api/chat"):
        response = http.post(
            path, content=raw, headers={**chat_headers, "Content-Type": "application/json"}
        )
        assert response.status_code == 400, response.text


def test_a_body_over_the_upload_limit_is_a_413(http, chat_headers):
    huge = {"prompt": "x" * (9 * 1024 * 1024)}
    response = http.post("/v1/completions", json=huge, headers=chat_headers)
    assert response.status_code == 413
    assert read_json(response)["error"]["code"] == "request_too_large"


def test_an_unknown_model_is_a_404_in_each_dialect(http, chat_headers):
    openai = http.post(
        "/v1/chat/completions", headers=chat_headers, json={**CHAT, "model": "no-such-model"}
    )
    assert openai.status_code == 404
    assert openai.json()["error"]["code"] == "model_not_found"
    ollama = http.post("/api/show", json={"model": "no-such-model"}, headers=chat_headers)
    assert ollama.status_code == 404 and "not found" in ollama.json()["error"]


@pytest.mark.model
def test_a_prompt_longer_than_the_context_is_a_400_before_any_stream(http, chat_headers):
    # Over the 8192 tokens the test model was trained for, so over any context it may hold
    # (2048 as set up, 8192 once a request asked num_ctx 8192).
    long = " ".join(["word"] * 9000)
    for stream in (False, True):
        response = http.post(
            "/v1/chat/completions",
            headers=chat_headers,
            json={**CHAT, "messages": [{"role": "user", "content": long}], "stream": stream},
        )
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "context_length_exceeded"
    ollama = http.post(
        "/api/generate", headers=chat_headers, json={"model": STARTER, "prompt": long, "raw": True}
    )
    assert ollama.status_code == 400 and "tokens" in ollama.json()["error"]


@pytest.mark.parametrize(
    ("path", "shape"),
    [("/v1/no-such-endpoint", "openai"), ("/v1/models/", "openai"), ("/api/no-such", "ollama"),
     ("/api/no/such/thing", "ollama")],
)  # fmt: skip
def test_an_unknown_api_path_is_a_json_404_in_its_dialect(http, path, shape):
    response = http.post(path, json={})
    assert response.status_code == 404
    assert response.headers["Content-Type"] == "application/json"
    error = response.json()["error"]
    if shape == "openai":
        assert "no endpoint" in error["message"] and error["type"] == "invalid_request_error"
    else:
        assert "no endpoint" in error


def test_openais_flex_service_tier_asks_for_background_priority():
    from dashboard.api.openai.schemas import ChatCompletionRequest

    messages = [{"role": "user", "content": "hi"}]
    assert ChatCompletionRequest(messages=messages, service_tier="flex").priority == "background"
    assert ChatCompletionRequest(messages=messages).priority == "interactive"
    assert ChatCompletionRequest(messages=messages, service_tier="priority").priority == (
        "interactive"  # a request may lower its priority, never raise it
    )
