"""Structured output through the live appliance and the real clients: Ollama `format` (a
schema, or "json"), OpenAI `response_format` (json_schema, json_object), a raw `grammar`, and
the 400s that name what a schema asks for that the grammar cannot enforce."""

import json

import jsonschema
import ollama
import pytest
from openai import BadRequestError, OpenAI

from tests.dashboard.api.server import STARTER, read_json

pytestmark = pytest.mark.model

# Home Assistant's AI Task asks for data in a shape like this one.
TASK = {
    "type": "object",
    "properties": {
        "device": {"type": "string", "maxLength": 16},
        "state": {"enum": ["on", "off"]},
        "brightness": {"type": "integer"},
        "rooms": {"type": "array", "items": {"type": "string", "maxLength": 10}, "maxItems": 2},
    },
    "required": ["device", "state", "brightness", "rooms"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Turn the kitchen lamp on. Answer as JSON."}]


@pytest.fixture
def ollama_client(appliance) -> ollama.Client:
    return ollama.Client(host=appliance.url, headers=appliance.headers("chat-app"), timeout=120)


@pytest.fixture
def openai_client(appliance) -> OpenAI:
    return OpenAI(base_url=f"{appliance.url}/v1", api_key=appliance.keys["chat-app"],
                  max_retries=0, timeout=120)  # fmt: skip


def test_ollama_format_with_a_schema_gives_data_that_validates(ollama_client):
    response = ollama_client.chat(model=STARTER, messages=ASK, format=TASK,
                                  options={"temperature": 0, "num_predict": 120})  # fmt: skip
    assert response.done_reason == "stop"
    jsonschema.validate(json.loads(response.message.content), TASK)


def test_ollama_format_streams_and_generate_takes_it_too(ollama_client):
    pieces = list(ollama_client.chat(model=STARTER, messages=ASK, format=TASK, stream=True,
                                     options={"temperature": 0.8, "seed": 3,
                                              "num_predict": 120}))  # fmt: skip
    assert pieces[-1].done and pieces[-1].done_reason == "stop"
    jsonschema.validate(json.loads("".join(p.message.content for p in pieces)), TASK)
    generated = ollama_client.generate(model=STARTER, prompt="A lamp as JSON.", format=TASK,
                                       options={"temperature": 0, "num_predict": 120})  # fmt: skip
    jsonschema.validate(json.loads(generated.response), TASK)


def test_ollama_format_json_makes_the_answer_a_json_object(ollama_client):
    # JSON mode lets the object run on, and this small model does not stop by itself within a
    # test's budget (the engine's tests show whole objects): here, the answer to a question
    # whose free answer is plain text starts as an object.
    question = [{"role": "user", "content": "Name a colour."}]
    options = {"temperature": 0, "num_predict": 6}
    free = ollama_client.chat(model=STARTER, messages=question, options=options)
    assert not free.message.content.lstrip().startswith("{")
    response = ollama_client.chat(model=STARTER, messages=question, format="json",
                                  options=options)  # fmt: skip
    assert response.message.content.startswith("{")


def test_openai_json_schema_gives_data_that_validates(openai_client):
    completion = openai_client.chat.completions.create(
        model=STARTER, messages=ASK, temperature=0, max_tokens=120,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "lamp", "schema": TASK, "strict": True}},
    )  # fmt: skip
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    jsonschema.validate(json.loads(choice.message.content), TASK)


def test_openai_json_schema_streams(openai_client):
    stream = openai_client.chat.completions.create(
        model=STARTER, messages=ASK, temperature=0.9, seed=11, max_tokens=120, stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "lamp", "schema": TASK}},
    )  # fmt: skip
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert chunks[-1].choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), TASK)


def test_openai_json_object_makes_the_answer_a_json_object(openai_client):
    question = [{"role": "user", "content": "Name a colour."}]
    completion = openai_client.chat.completions.create(
        model=STARTER, messages=question, temperature=0, max_tokens=6,
        response_format={"type": "json_object"},
    )  # fmt: skip
    assert completion.choices[0].message.content.startswith("{")


def test_a_raw_grammar_holds_the_answer_on_every_endpoint(http, chat_headers, openai_client):
    grammar = 'root ::= ("yes" | "no") "."'
    chat = openai_client.chat.completions.create(
        model=STARTER, messages=ASK, max_tokens=8, extra_body={"grammar": grammar})
    assert chat.choices[0].message.content in ("yes.", "no.")
    completion = openai_client.completions.create(
        model=STARTER, prompt="Is the sky blue?", max_tokens=8, extra_body={"grammar": grammar})
    assert completion.choices[0].text in ("yes.", "no.")
    body = {"model": STARTER, "messages": ASK, "stream": False, "grammar": grammar,
            "options": {"num_predict": 8}}  # fmt: skip
    answer = read_json(http.post("/api/chat", json=body, headers=chat_headers))
    assert answer["message"]["content"] in ("yes.", "no.")


def test_a_schema_keyword_the_grammar_cannot_enforce_is_a_400_naming_it(
    http, chat_headers, openai_client, ollama_client
):
    schema = {"type": "object", "properties": {"level": {"type": "integer", "minimum": 0},
                                               "tags": {"type": "object",
                                                        "patternProperties": {"^t": {}}}}}
    with pytest.raises(BadRequestError) as refused:
        openai_client.chat.completions.create(
            model=STARTER, messages=ASK, max_tokens=8,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
        )  # fmt: skip
    error = refused.value.body
    assert error["param"] == "response_format.json_schema.schema"
    assert "minimum (at /properties/level)" in error["message"]
    assert "patternProperties (at /properties/tags)" in error["message"]
    with pytest.raises(ollama.ResponseError) as refused:
        ollama_client.chat(model=STARTER, messages=ASK, format=schema)
    assert refused.value.status_code == 400
    assert "minimum" in refused.value.error and "patternProperties" in refused.value.error


@pytest.mark.parametrize(
    ("path", "fields", "param"),
    [
        ("/v1/chat/completions", {"grammar": "root ::= nothing-here"}, "grammar"),
        ("/v1/completions", {"grammar": "root ::= nothing-here"}, "grammar"),
        ("/v1/chat/completions", {"grammar": 'root ::= "a"',
                                  "response_format": {"type": "json_object"}}, "response_format"),
        ("/v1/chat/completions", {"response_format": {"type": "json_schema"}}, "response_format"),
        ("/v1/chat/completions", {"grammar": "x" * 70_000}, "grammar"),
    ],
)  # fmt: skip
def test_a_grammar_that_cannot_run_is_a_400_before_any_answer(
    http, chat_headers, path, fields, param
):
    body = {"model": STARTER, "max_tokens": 4, **fields}
    body |= {"prompt": "x"} if path == "/v1/completions" else {"messages": ASK}
    for stream in (False, True):
        response = http.post(path, json={**body, "stream": stream}, headers=chat_headers)
        assert response.status_code == 400, response.text
        assert read_json(response)["error"]["param"] == param


def test_ollama_refuses_a_grammar_beside_format_and_a_format_that_is_neither(http, chat_headers):
    base = {"model": STARTER, "messages": ASK, "stream": False}
    for fields in ({"format": "json", "grammar": 'root ::= "a"'}, {"format": "yaml"},
                   {"format": ["json"]}, {"grammar": "root ::= nothing-here"}):  # fmt: skip
        response = http.post("/api/chat", json={**base, **fields}, headers=chat_headers)
        assert response.status_code == 400, response.text
        assert isinstance(read_json(response)["error"], str)


# --- tool calls --------------------------------------------------------------------------

TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou can call these tools: {{ tools | tojson }}. To call "
    'one, write <tool_call>{"name": ..., "arguments": {...}}</tool_call>.<|im_end|>\n'
    "{% endif %}{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}<|im_start|>assistant\n"
)
LIGHT_TOOL = {"type": "function", "function": {
    "name": "set_light", "description": "Switch a light.",
    "parameters": {"type": "object", "properties": {"room": {"type": "string", "maxLength": 12},
                                                    "on": {"type": "boolean"}},
                   "required": ["room", "on"]},
}}  # fmt: skip


@pytest.fixture
def tool_template(appliance):
    """The starter model with a template that offers tools and marks calls, as Qwen's does."""
    def override(template: str) -> None:
        appliance.shell(
            "from inference.models import LLMModel; "
            f"LLMModel.objects.filter(name={STARTER!r}).update(chat_template_override={template!r})"
        )

    override(TOOL_TEMPLATE)
    yield
    override("")


def test_tool_calls_still_stream_with_their_grammar_attached(openai_client, tool_template):
    # The answer carries the tool-call grammar (started by the <tool_call> token where the
    # vocabulary has one; this model's has not, so the answer is free): it streams as before.
    question = [{"role": "user", "content": "Turn on the hall light."}]
    sizes = [openai_client.chat.completions.create(
        model=STARTER, messages=question, max_tokens=1, **extra).usage.prompt_tokens
        for extra in ({}, {"tools": [LIGHT_TOOL]})]  # fmt: skip
    assert sizes[1] > sizes[0] + 20  # the template rendered the tools: their calls are parsed
    for parallel in (True, False):
        chunks = list(openai_client.chat.completions.create(
            model=STARTER, messages=question, tools=[LIGHT_TOOL], parallel_tool_calls=parallel,
            temperature=0, max_tokens=40, stream=True,
        ))  # fmt: skip
        assert chunks[-1].choices[0].finish_reason in ("stop", "length", "tool_calls")
        for chunk in chunks:
            for call in chunk.choices[0].delta.tool_calls or []:
                assert call.function.name == "set_light"
                jsonschema.validate(json.loads(call.function.arguments),
                                    LIGHT_TOOL["function"]["parameters"])  # fmt: skip


def test_a_format_beside_tools_holds_the_whole_answer(ollama_client, tool_template):
    response = ollama_client.chat(model=STARTER, messages=ASK, tools=[LIGHT_TOOL], format=TASK,
                                  options={"temperature": 0, "num_predict": 120})  # fmt: skip
    assert not response.message.tool_calls
    jsonschema.validate(json.loads(response.message.content), TASK)
