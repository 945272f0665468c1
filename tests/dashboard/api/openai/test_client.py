"""The official openai package against the live appliance: models, chat and completions,
streamed and not, with usage and the appliance's timings."""

import time

import pytest
from openai import OpenAI

from tests.dashboard.api.server import STARTER

pytestmark = pytest.mark.model

TIMING_KEYS = {
    "prompt_n",
    "prompt_ms",
    "prompt_per_second",
    "predicted_n",
    "predicted_ms",
    "predicted_per_second",
    "cache_n",
    "ttft_ms",
    "queue_ms",
    "load_ms",
    "itl_ms",
}
QUESTION = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture
def client(appliance) -> OpenAI:
    return OpenAI(
        base_url=f"{appliance.url}/v1",
        api_key=appliance.keys["chat-app"],
        max_retries=0,
        timeout=120,
    )


def test_it_lists_the_registered_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == [STARTER]
    assert client.models.retrieve(STARTER).id == STARTER


def test_it_answers_a_chat_with_usage_and_timings(client):
    answer = client.chat.completions.create(
        model=STARTER, messages=QUESTION, max_tokens=6, temperature=0
    )
    choice = answer.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    usage = answer.usage
    assert usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= 6
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert usage.prompt_tokens_details.cached_tokens >= 0
    timings = answer.model_extra["timings"]
    assert TIMING_KEYS <= timings.keys()
    assert timings["prompt_n"] + timings["cache_n"] == usage.prompt_tokens
    assert timings["predicted_n"] == usage.completion_tokens
    assert set(timings["itl_ms"]) == {"p50", "p95", "p99", "max"}
    assert timings["ttft_ms"] >= timings["prompt_ms"]  # TTFT = queue + load + prefill


def test_it_streams_a_chat_whose_ttft_agrees_with_what_the_client_measures(client):
    sent = time.perf_counter()
    stream = client.chat.completions.create(
        model=STARTER,
        messages=[{"role": "user", "content": "Tell me about cats."}],
        max_tokens=8,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    first_token_at = None
    pieces, finish, timings, usage = [], None, None, None
    for chunk in stream:
        if chunk.choices:
            delta = chunk.choices[0].delta
            if delta.content:
                first_token_at = first_token_at or time.perf_counter()
                pieces.append(delta.content)
            if chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
                timings = chunk.model_extra["timings"]
        else:  # the include_usage chunk comes last, with no choices
            usage = chunk.usage
    assert pieces and finish in ("stop", "length")
    assert usage is not None and usage.completion_tokens == timings["predicted_n"]
    client_ttft = first_token_at - sent
    server_ttft = timings["ttft_ms"] / 1000
    # A consistency check with generous slack, not a timing assertion: the server's TTFT is
    # inside the client's (the client also pays HTTP and parsing), and not wildly smaller.
    assert server_ttft <= client_ttft + 0.05
    assert client_ttft <= server_ttft + 2.0


def test_it_completes_a_raw_prompt_streamed_and_not(client):
    answer = client.completions.create(
        model=STARTER, prompt="1, 2, 3, 4,", max_tokens=4, temperature=0
    )
    assert answer.object == "text_completion"
    assert answer.choices[0].text
    assert answer.usage.completion_tokens <= 4
    streamed = client.completions.create(
        model=STARTER, prompt="1, 2, 3, 4,", max_tokens=4, temperature=0, stream=True
    )
    chunks = list(streamed)
    assert "".join(c.choices[0].text for c in chunks)
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_a_request_with_tools_gets_a_plain_answer_when_the_template_has_no_tools(client):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    answer = client.chat.completions.create(
        model=STARTER,
        messages=[{"role": "user", "content": "Weather in Paris?"}],
        tools=tools,
        max_tokens=6,
        temperature=0,
    )
    assert answer.choices[0].finish_reason in ("stop", "length")
    assert answer.choices[0].message.content
    assert not answer.choices[0].message.tool_calls


def test_the_stop_string_ends_the_answer(client):
    answer = client.completions.create(
        model=STARTER, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=["7"]
    )
    assert "7" not in answer.choices[0].text


def test_one_app_never_learns_from_the_cache_how_far_it_matches_anothers_conversation(appliance):
    def app(key: str) -> OpenAI:
        return OpenAI(base_url=f"{appliance.url}/v1", api_key=appliance.keys[key],
                      max_retries=0, timeout=120)  # fmt: skip

    secret = [
        {"role": "system", "content": "The door code is 7 6 6 1. Never tell anyone."},
        {"role": "user", "content": "Remind me of the plan for tonight, please."},
    ]
    first = app("chat-app").chat.completions.create(
        model=STARTER, messages=secret, max_tokens=4, temperature=0
    )
    follow_up = [*secret, {"role": "assistant", "content": first.choices[0].message.content},
                 {"role": "user", "content": "Thanks."}]  # fmt: skip

    other = app("busy-0").chat.completions.create(
        model=STARTER, messages=follow_up, max_tokens=2, temperature=0
    )
    assert other.usage.prompt_tokens_details.cached_tokens == 0
    assert other.model_extra["timings"]["cache_n"] == 0

    own = app("chat-app").chat.completions.create(
        model=STARTER, messages=follow_up, max_tokens=2, temperature=0
    )
    assert own.usage.prompt_tokens_details.cached_tokens > 20  # its own turn is reused
