"""The official openai client against the live appliance: n choices (each its own sequence,
streamed and not, usage counting them all) and logit_bias (a ban moves the greedy answer off its
first token; +100 makes a token the pick)."""

import httpx
import openai
import pytest
from openai import OpenAI

from tests.dashboard.api.server import STARTER

pytestmark = pytest.mark.model

QUESTION = [{"role": "user", "content": "Name a colour."}]


@pytest.fixture
def client(appliance) -> OpenAI:
    return OpenAI(base_url=f"{appliance.url}/v1", api_key=appliance.keys["chat-app"],
                  max_retries=0, timeout=120)  # fmt: skip


def token_id(http: httpx.Client, headers: dict, text: str) -> int:
    tokens = http.post("/tokenize", json={"content": text}, headers=headers).json()["tokens"]
    assert len(tokens) == 1, f"{text!r} is {len(tokens)} tokens"
    return tokens[0]


def test_n_choices_are_separate_answers_and_usage_counts_them_all(client):
    answer = client.chat.completions.create(model=STARTER, messages=QUESTION, n=3,
                                            max_tokens=12, temperature=1.0, seed=11)  # fmt: skip
    assert [choice.index for choice in answer.choices] == [0, 1, 2]
    assert all(choice.message.content for choice in answer.choices)
    alone = client.chat.completions.create(model=STARTER, messages=QUESTION, max_tokens=12,
                                           temperature=1.0, seed=11)  # fmt: skip
    # The first choice is what the request alone gives; the others have seeds of their own.
    assert answer.choices[0].message.content == alone.choices[0].message.content
    assert answer.usage.prompt_tokens == alone.usage.prompt_tokens
    assert answer.usage.completion_tokens >= 3
    assert answer.usage.total_tokens == answer.usage.prompt_tokens + answer.usage.completion_tokens


def test_greedy_choices_agree_and_their_tokens_add_up(client):
    answer = client.completions.create(model=STARTER, prompt="The sky is", n=2, max_tokens=5,
                                       temperature=0)  # fmt: skip
    texts = [choice.text for choice in answer.choices]
    assert texts[0] == texts[1] and texts[0]
    single = client.completions.create(model=STARTER, prompt="The sky is", max_tokens=5,
                                       temperature=0)  # fmt: skip
    assert single.choices[0].text == texts[0]
    assert answer.usage.completion_tokens == 2 * single.usage.completion_tokens


def test_streamed_choices_join_to_each_choice_and_end_with_one_usage_chunk(client):
    stream = client.chat.completions.create(model=STARTER, messages=QUESTION, n=2, max_tokens=8,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True})  # fmt: skip
    texts, reasons, usages = ["", ""], [None, None], []
    for chunk in stream:
        if chunk.usage is not None:
            usages.append(chunk.usage)
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    whole = client.chat.completions.create(model=STARTER, messages=QUESTION, max_tokens=8,
                                           temperature=0)  # fmt: skip
    assert texts == [whole.choices[0].message.content] * 2
    assert None not in reasons
    assert len(usages) == 1
    assert usages[0].completion_tokens == 2 * whole.usage.completion_tokens


def test_more_than_eight_choices_is_a_400_naming_n(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=STARTER, messages=QUESTION, n=9, max_tokens=2)
    assert raised.value.body["param"] == "n"


def test_a_ban_on_the_first_token_changes_the_first_token(client, http, chat_headers):
    first = client.completions.create(model=STARTER, prompt="The capital of France is",
                                      max_tokens=1, temperature=0).choices[0].text  # fmt: skip
    banned = token_id(http, chat_headers, first)
    other = client.completions.create(model=STARTER, prompt="The capital of France is",
                                      max_tokens=1, temperature=0,
                                      logit_bias={str(banned): -100}).choices[0].text  # fmt: skip
    assert other != first


def test_a_bias_of_100_on_a_token_makes_it_the_answer(client, http, chat_headers):
    banana = token_id(http, chat_headers, " banana")
    answer = client.chat.completions.create(model=STARTER, messages=QUESTION, max_tokens=3,
                                            temperature=0.7, logit_bias={str(banana): 100})
    assert answer.choices[0].message.content == " banana" * 3


@pytest.mark.parametrize("bias", [
    {"x": 1}, {"-5": 1}, {"5": 101}, {"5": -100.5}, {str(t): 1 for t in range(301)},
])  # fmt: skip
def test_a_bad_logit_bias_is_a_400_naming_it(client, bias):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=STARTER, messages=QUESTION, max_tokens=2,
                                       logit_bias=bias)  # fmt: skip
    assert raised.value.body["param"] == "logit_bias"


def test_a_token_past_the_vocabulary_is_a_400_naming_logit_bias(client):
    with pytest.raises(openai.BadRequestError) as raised:
        client.chat.completions.create(model=STARTER, messages=QUESTION, max_tokens=2,
                                       logit_bias={str(10**9): -100})  # fmt: skip
    assert raised.value.body["param"] == "logit_bias"
