"""The official anthropic package against the live appliance: /v1/messages created and streamed,
with a system prompt, stop sequences, max_tokens, tool use and thinking; the key as x-api-key;
errors in Anthropic's shape."""

import anthropic
import httpx
import openai
import pytest

from tests.dashboard.api.server import STARTER
from tests.dashboard.api.test_thinking import NAME as THINKING
from tests.dashboard.api.test_thinking import (
    PARIS,
    oracle,
    raw_answer,
    thinking_model,  # noqa: F401 - the fixture
)

pytestmark = pytest.mark.model

HI = [{"role": "user", "content": "Tell me about cats."}]
# The SDK dropped temperature from its signature; clients that sample send it as extra_body.
GREEDY = {"extra_body": {"temperature": 0}}
WEATHER_TOOL = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}


@pytest.fixture
def client(appliance) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=appliance.url, api_key=appliance.keys["chat-app"],
                               max_retries=0, timeout=120)  # fmt: skip


@pytest.fixture
def openai_client(appliance) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{appliance.url}/v1", api_key=appliance.keys["chat-app"],
                         max_retries=0, timeout=120)  # fmt: skip


@pytest.fixture
def ollama_client(appliance):
    import ollama

    return ollama.Client(host=appliance.url, headers=appliance.headers("chat-app"), timeout=600)


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def test_it_answers_a_message_with_anthropic_usage(client):
    message = client.messages.create(model=STARTER, max_tokens=8, messages=HI, **GREEDY)
    assert message.type == "message" and message.role == "assistant"
    assert message.id.startswith("msg_") and message.model == STARTER
    assert [block.type for block in message.content] == ["text"] and text_of(message)
    assert message.stop_reason in ("end_turn", "max_tokens")
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens > 0
    assert 0 < usage.output_tokens <= 8
    assert message.model_extra["timings"]["predicted_n"] == usage.output_tokens


def test_the_answer_is_the_chat_completions_answer_to_the_same_conversation(client, openai_client):
    """One prompt path: the system prompt (a string or text blocks) reaches the template as
    chat completions' system message does, so a greedy answer is the same."""
    system = "You are a pirate."
    chat = openai_client.chat.completions.create(
        model=STARTER, max_tokens=12, **GREEDY,
        messages=[{"role": "system", "content": system}, *HI],
    )  # fmt: skip
    expected = chat.choices[0].message.content
    as_string = client.messages.create(model=STARTER, max_tokens=12, **GREEDY,
                                       system=system, messages=HI)  # fmt: skip
    as_blocks = client.messages.create(
        model=STARTER, max_tokens=12, **GREEDY, messages=HI,
        system=[{"type": "text", "text": system}],
    )  # fmt: skip
    assert text_of(as_string) == text_of(as_blocks) == expected
    usage = as_string.usage
    assert usage.input_tokens + usage.cache_read_input_tokens == chat.usage.prompt_tokens


def test_max_tokens_ends_the_answer_with_stop_reason_max_tokens(client):
    message = client.messages.create(model=STARTER, max_tokens=3, messages=HI, **GREEDY)
    assert message.stop_reason == "max_tokens"
    assert message.stop_sequence is None
    assert message.usage.output_tokens == 3


def test_a_stop_sequence_ends_the_answer_and_is_named(client):
    whole = text_of(client.messages.create(model=STARTER, max_tokens=24, messages=HI,
                                           **GREEDY))  # fmt: skip
    words = whole.split()
    assert len(words) > 4, f"the premise: a longer answer: {whole!r}"
    stop = words[3]
    message = client.messages.create(model=STARTER, max_tokens=24, messages=HI, **GREEDY,
                                     stop_sequences=[stop, "zzzz-never"])  # fmt: skip
    assert message.stop_reason == "stop_sequence"
    assert message.stop_sequence == stop
    assert text_of(message) == whole[: whole.index(stop)]


def test_a_streamed_answer_joins_to_its_final_message_and_to_the_created_one(client):
    created = client.messages.create(model=STARTER, max_tokens=16, messages=HI, **GREEDY)
    with client.messages.stream(model=STARTER, max_tokens=16, messages=HI,
                                **GREEDY) as stream:  # fmt: skip
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert len(pieces) > 1  # streamed in deltas, not in one
    assert "".join(pieces) == text_of(final) == text_of(created)
    assert final.stop_reason == created.stop_reason
    assert final.usage.output_tokens == created.usage.output_tokens
    total = final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)
    assert total == created.usage.input_tokens + created.usage.cache_read_input_tokens


def test_the_raw_event_sequence_is_anthropics(client):
    with client.messages.stream(model=STARTER, max_tokens=4, messages=HI,
                                **GREEDY) as stream:  # fmt: skip
        kinds = [event.type for event in stream]
    # The SDK adds its own "text" events beside content_block_delta; the wire's are these.
    wire = [k for k in kinds if k != "text"]
    assert wire[0] == "message_start"
    assert wire[1] == "content_block_start" and wire[-3] == "content_block_stop"
    assert set(wire[2:-3]) == {"content_block_delta"}
    assert wire[-2:] == ["message_delta", "message_stop"]


@pytest.mark.timeout(900)  # four answers of the thinking model: minutes on a busy 2-core box
def test_tool_use_round_trip(thinking_model, client):  # noqa: F811
    """The model calls the tool (a tool_use block, stop_reason tool_use), in both forms; the
    call and its tool_result go back as the template's tool call and tool message. (That the
    model calls it, answering greedily, is test_thinking's premise.)"""
    asked = {"model": THINKING, "max_tokens": 80, **GREEDY, "messages": PARIS,
             "tools": [WEATHER_TOOL]}  # fmt: skip
    message = client.messages.create(**asked)
    assert message.stop_reason == "tool_use"
    calls = [block for block in message.content if block.type == "tool_use"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert calls[0].id.startswith("toolu_") and isinstance(calls[0].input, dict)

    with client.messages.stream(**asked) as stream:
        streamed = stream.get_final_message()
    streamed_calls = [block for block in streamed.content if block.type == "tool_use"]
    assert [(c.name, c.input) for c in streamed_calls] == [(c.name, c.input) for c in calls]
    assert streamed.stop_reason == "tool_use"

    follow_up = client.messages.create(
        model=THINKING, max_tokens=40, **GREEDY, tools=[WEATHER_TOOL],
        messages=[*PARIS, {"role": "assistant", "content": message.content},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id":
                                                calls[0].id, "content": "Sunny, 21 °C"}]}],
    )  # fmt: skip
    assert follow_up.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert follow_up.usage.input_tokens + follow_up.usage.cache_read_input_tokens > (
        message.usage.input_tokens + message.usage.cache_read_input_tokens
    )  # the call and its result are in the prompt


@pytest.mark.timeout(900)
def test_thinking_comes_back_as_thinking_blocks(thinking_model, client, ollama_client):  # noqa: F811
    hi = [{"role": "user", "content": "Hi"}]
    thinking, content = oracle(raw_answer(ollama_client, hi), inside=True)
    assert thinking and content
    asked = {"model": THINKING, "max_tokens": 80, **GREEDY, "messages": hi,
             "thinking": {"type": "enabled", "budget_tokens": 1024}}  # fmt: skip
    message = client.messages.create(**asked)
    assert [block.type for block in message.content] == ["thinking", "text"]
    assert (message.content[0].thinking, message.content[1].text) == (thinking, content)
    with client.messages.stream(**asked) as stream:
        events = list(stream)
        final = stream.get_final_message()
    deltas = [e.delta for e in events if e.type == "content_block_delta"]
    assert "".join(d.thinking for d in deltas if d.type == "thinking_delta") == thinking
    assert "".join(d.text for d in deltas if d.type == "text_delta") == content
    assert [block.type for block in final.content] == ["thinking", "text"]


def test_thinking_for_a_model_that_cannot_think_is_an_invalid_request(client):
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(model=STARTER, max_tokens=8, messages=HI,
                               thinking={"type": "enabled", "budget_tokens": 1024})  # fmt: skip
    assert raised.value.body["error"]["type"] == "invalid_request_error"


def test_the_key_goes_as_x_api_key_or_bearer(appliance, client):
    body = {"model": STARTER, "max_tokens": 2, "messages": HI}
    key = appliance.keys["chat-app"]
    for headers in ({"x-api-key": key}, {"Authorization": f"Bearer {key}"}):
        answer = httpx.post(f"{appliance.url}/v1/messages", json=body, headers=headers,
                            timeout=120)  # fmt: skip
        assert answer.status_code == 200, answer.text
    wrong = anthropic.Anthropic(base_url=appliance.url, api_key="not-a-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as raised:
        wrong.messages.create(model=STARTER, max_tokens=2, messages=HI)
    assert raised.value.body == {"type": "error", "error": {
        "type": "authentication_error", "message": "the API key is not valid or has been revoked",
    }}  # fmt: skip
    anonymous = httpx.post(f"{appliance.url}/v1/messages", json=body, timeout=30)
    assert anonymous.status_code == 401
    assert anonymous.json()["error"]["type"] == "authentication_error"


def test_errors_come_in_anthropics_shape(appliance, client):
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(
            model=STARTER, max_tokens=8, messages=HI, extra_body={"temperature": 1.5}
        )
    body = raised.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "temperature" in body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as raised:
        client.messages.create(model="no-such-model", max_tokens=8, messages=HI)
    assert raised.value.body["error"]["type"] == "not_found_error"
    missing = httpx.post(f"{appliance.url}/v1/messages", headers=appliance.headers("chat-app"),
                         json={"model": STARTER, "messages": HI}, timeout=30)  # fmt: skip
    assert missing.status_code == 400
    assert missing.json()["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in missing.json()["error"]["message"]
    document = [{"role": "user", "content": [{"type": "document", "source": {}}]}]
    with pytest.raises(anthropic.BadRequestError) as raised:
        client.messages.create(model=STARTER, max_tokens=8, messages=document)
    assert "not supported" in raised.value.body["error"]["message"]
