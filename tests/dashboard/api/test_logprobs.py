"""Log-probabilities through the real openai and ollama clients against the live appliance,
streamed and not, checked for what they must be: the greedy token is the likeliest of its step,
every value is the log of a probability, the list is sorted, and the tokens spell the answer."""

import math

import ollama
import pytest
from openai import OpenAI

from tests.dashboard.api.server import STARTER

pytestmark = pytest.mark.model

QUESTION = [{"role": "user", "content": "Name three colours."}]
GREEDY = {"temperature": 0, "max_tokens": 12}


@pytest.fixture
def client(appliance) -> OpenAI:
    return OpenAI(base_url=f"{appliance.url}/v1", api_key=appliance.keys["chat-app"],
                  max_retries=0, timeout=120)  # fmt: skip


@pytest.fixture
def ollama_client(appliance) -> ollama.Client:
    return ollama.Client(host=appliance.url, headers=appliance.headers("chat-app"), timeout=120)


def check_greedy_step(token: str, logprob: float, top: list, n: int) -> None:
    """One greedy step's entry, as any dialect gives it (objects with token and logprob)."""
    assert len(top) == n
    assert top[0].token == token and top[0].logprob == logprob  # greedy: the likeliest
    values = [t.logprob for t in top]
    assert values == sorted(values, reverse=True)
    assert all(value <= 0.0 for value in values)
    assert sum(math.exp(value) for value in values) <= 1.0 + 1e-9


def spelled(entries) -> str:
    return b"".join(bytes(e.bytes) for e in entries).decode("utf-8")


def test_openai_chat_logprobs_are_the_greedy_tokens_and_spell_the_answer(client):
    answer = client.chat.completions.create(model=STARTER, messages=QUESTION, logprobs=True,
                                            top_logprobs=5, **GREEDY)  # fmt: skip
    choice = answer.choices[0]
    entries = choice.logprobs.content
    assert len(entries) == answer.usage.completion_tokens
    for entry in entries:
        check_greedy_step(entry.token, entry.logprob, entry.top_logprobs, 5)
    assert spelled(entries) == choice.message.content


def test_openai_chat_streams_each_chunks_own_logprobs_the_same_as_whole(client):
    whole = client.chat.completions.create(model=STARTER, messages=QUESTION, logprobs=True,
                                           top_logprobs=2, **GREEDY).choices[0]  # fmt: skip
    streamed, text = [], ""
    for chunk in client.chat.completions.create(model=STARTER, messages=QUESTION, logprobs=True,
                                                top_logprobs=2, stream=True, **GREEDY):  # fmt: skip
        choice = chunk.choices[0]
        text += choice.delta.content or ""
        if choice.logprobs is not None:
            streamed += choice.logprobs.content
    assert text == whole.message.content
    assert [(e.token, e.logprob) for e in streamed] == [
        (e.token, e.logprob) for e in whole.logprobs.content]  # fmt: skip
    assert spelled(streamed) == text


def test_without_logprobs_a_chat_has_none(client):
    answer = client.chat.completions.create(model=STARTER, messages=QUESTION, **GREEDY)
    assert answer.choices[0].logprobs is None


def test_the_tokens_of_a_stop_string_are_not_listed(client):
    free = client.chat.completions.create(model=STARTER, messages=QUESTION, logprobs=True,
                                          **GREEDY).choices[0]  # fmt: skip
    words = free.message.content.split()
    assert len(words) > 2, f"the premise: a few words to stop at: {free.message.content!r}"
    stop = " " + words[2]
    cut = client.chat.completions.create(model=STARTER, messages=QUESTION, logprobs=True,
                                         stop=[stop], **GREEDY).choices[0]  # fmt: skip
    assert cut.message.content == free.message.content.split(stop)[0]
    assert spelled(cut.logprobs.content) == cut.message.content
    assert all(e.top_logprobs == [] for e in cut.logprobs.content)


def test_openai_completions_give_the_legacy_columns(client):
    prompt = "The capital of France is"
    whole = client.completions.create(model=STARTER, prompt=prompt, logprobs=3, **GREEDY)
    logprobs = whole.choices[0].logprobs
    assert "".join(logprobs.tokens) == whole.choices[0].text
    assert len(logprobs.token_logprobs) == len(logprobs.tokens) == whole.usage.completion_tokens
    assert logprobs.text_offset[0] == 0
    for token, logprob, top in zip(logprobs.tokens, logprobs.token_logprobs,
                                   logprobs.top_logprobs, strict=True):  # fmt: skip
        assert top[token] == logprob == max(top.values())
        assert len(top) == 3  # greedy: the sampled token is one of the three likeliest
    streamed = [c.choices[0].logprobs for c in client.completions.create(
        model=STARTER, prompt=prompt, logprobs=3, stream=True, **GREEDY)]  # fmt: skip
    pieces = [p for p in streamed if p is not None]
    assert [t for p in pieces for t in p.tokens] == logprobs.tokens
    assert [o for p in pieces for o in p.text_offset] == logprobs.text_offset


def test_ollama_chat_and_generate_give_logprobs_streamed_and_not(ollama_client):
    options = {"temperature": 0, "num_predict": 12}
    answer = ollama_client.chat(model=STARTER, messages=QUESTION, options=options,
                                logprobs=True, top_logprobs=4)  # fmt: skip
    assert len(answer.logprobs) == answer.eval_count
    for entry in answer.logprobs:
        check_greedy_step(entry.token, entry.logprob, entry.top_logprobs, 4)
    assert "".join(e.token for e in answer.logprobs) == answer.message.content

    streamed, text = [], ""
    for part in ollama_client.chat(model=STARTER, messages=QUESTION, options=options,
                                   logprobs=True, top_logprobs=4, stream=True):  # fmt: skip
        text += part.message.content
        streamed += part.logprobs or []
    assert text == answer.message.content
    assert [(e.token, e.logprob) for e in streamed] == [
        (e.token, e.logprob) for e in answer.logprobs]  # fmt: skip

    generated = ollama_client.generate(model=STARTER, prompt="Name three colours.",
                                       options=options, logprobs=True)  # fmt: skip
    assert "".join(e.token for e in generated.logprobs) == generated.response
    assert all(e.top_logprobs is None for e in generated.logprobs)  # none asked: left out
    plain = ollama_client.generate(model=STARTER, prompt="Name three colours.", options=options)
    assert plain.logprobs is None
