"""Thinking through the real ollama and openai clients against the live appliance: the switch,
the thinking returned apart from the answer (streamed and not), tool calls after thinking, and
the 400 for a model that cannot think.

The model is the starter model's weights under a thinking template (FEW_SHOT): its generation
prompt opens the <think> block and its earlier turns show the pattern, so the model, answering
greedily, writes thinking, "</think>" and an answer. What it writes is not assumed: each test
first has the same prompt answered raw (no template, no splitting), and the split answers must
be exactly that raw text cut by the rules (`oracle`)."""

import json
import re

import httpx
import ollama
import openai
import pytest

from inference.gguf.chat_template import render_chat
from tests.dashboard.api.server import STARTER
from tests.inference.text.thinking_templates import FEW_SHOT

pytestmark = pytest.mark.model

NAME = "smollm2-thinking"
HI = [{"role": "user", "content": "Hi"}]
PARIS = [{"role": "user", "content": "Weather in Paris?"}]
CITY = {"type": "object", "properties": {"city": {"type": "string"}}}
WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": CITY}}]
GREEDY = {"temperature": 0, "num_predict": 80}

REGISTER_TWIN = f"""
from pathlib import Path
from django.conf import settings
from inference.models import LLMModel
starter = LLMModel.objects.get(name={STARTER!r})
LLMModel.all_objects.filter(name={NAME!r}).delete()  # another module's twin: a shared fixture
link = Path(settings.MODELS_DIR) / "{NAME}.gguf"
link.unlink(missing_ok=True)
link.symlink_to(starter.file_path)
twin = LLMModel.objects.get(pk=starter.pk)
twin.pk, twin.name, twin.file_path, twin.is_default = None, {NAME!r}, str(link), False
twin.pulled_name = None
twin.chat_template_override = {FEW_SHOT!r}
twin.save()
"""


@pytest.fixture(scope="module")
def thinking_model(appliance):
    """The starter model's weights registered again as NAME, with the FEW_SHOT template; deleted
    (unloaded, its link removed) when the module is done."""
    appliance.shell(REGISTER_TWIN)
    yield NAME
    httpx.request("DELETE", f"{appliance.url}/api/delete", json={"model": NAME},
                  headers=appliance.headers("admin-app"), timeout=120)  # fmt: skip


@pytest.fixture
def ollama_client(appliance) -> ollama.Client:
    return ollama.Client(host=appliance.url, headers=appliance.headers("chat-app"), timeout=600)


@pytest.fixture
def openai_client(appliance) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{appliance.url}/v1", api_key=appliance.keys["chat-app"],
                         timeout=600, max_retries=0)  # fmt: skip


def oracle(raw: str, inside: bool) -> tuple[str, str]:
    """The raw answer cut by the rules: the leading block (everything up to the first close
    when the prompt opened it) is thinking, stripped; the rest is the answer."""
    if not inside:
        match = re.match(r"\s*<think>", raw)
        if match is None:
            return "", raw.lstrip()
        raw = raw[match.end() :]
    thinking, closed, content = raw.partition("</think>")
    return thinking.strip(), content.lstrip() if closed else ""


def raw_answer(client: ollama.Client, messages: list[dict], **variables) -> str:
    """The model's answer to the FEW_SHOT prompt, sent raw: nothing split or parsed."""
    prompt = render_chat(FEW_SHOT, messages, **variables)
    return client.generate(model=NAME, prompt=prompt, raw=True, options=GREEDY).response


def test_ollama_chat_streams_the_thinking_apart_from_the_answer(thinking_model, ollama_client):
    raw = raw_answer(ollama_client, HI)
    thinking, content = oracle(raw, inside=True)
    assert thinking and content, f"the premise: the model thinks, then answers: {raw!r}"

    lines = list(ollama_client.chat(model=NAME, messages=HI, think=True, stream=True,
                                    options=GREEDY))  # fmt: skip
    streamed_thinking = "".join(line.message.thinking or "" for line in lines)
    streamed_content = "".join(line.message.content or "" for line in lines)
    assert (streamed_thinking, streamed_content) == (thinking, content)
    kinds = [("t" if line.message.thinking else "") + ("c" if line.message.content else "")
             for line in lines]  # fmt: skip
    assert "".join(kinds).startswith("t") and re.fullmatch(r"t+c+", "".join(kinds))
    assert len([k for k in kinds if k]) > 2  # streamed in pieces, not in one line
    assert lines[-1].done and lines[-1].done_reason == "stop"

    whole = ollama_client.chat(model=NAME, messages=HI, think=True, options=GREEDY)
    assert (whole.message.thinking, whole.message.content) == (thinking, content)


def test_ollama_generate_returns_thinking_beside_the_response(thinking_model, ollama_client):
    thinking, content = oracle(raw_answer(ollama_client, HI), inside=True)
    answer = ollama_client.generate(model=NAME, prompt="Hi", think=True, options=GREEDY)
    assert (answer.thinking, answer.response) == (thinking, content)
    lines = list(ollama_client.generate(model=NAME, prompt="Hi", think="high", stream=True,
                                        options=GREEDY))  # fmt: skip
    assert "".join(line.thinking or "" for line in lines) == thinking
    assert "".join(line.response for line in lines) == content


def test_think_false_turns_the_thinking_off(thinking_model, ollama_client):
    raw = raw_answer(ollama_client, HI, enable_thinking=False)
    assert oracle(raw, inside=False)[0] == "", (
        f"the premise: no thinking after an empty block: {raw!r}"
    )
    answer = ollama_client.chat(model=NAME, messages=HI, think=False, options=GREEDY)
    assert answer.message.thinking is None
    assert answer.message.content == raw.lstrip()
    assert "think>" not in answer.message.content


def test_openai_streams_reasoning_content_deltas_and_returns_it_in_the_message(
    thinking_model, ollama_client, openai_client
):
    thinking, content = oracle(raw_answer(ollama_client, HI), inside=True)
    stream = openai_client.chat.completions.create(
        model=NAME, messages=HI, reasoning_effort="medium", stream=True, temperature=0,
        max_tokens=80,
    )  # fmt: skip
    deltas = [chunk.choices[0].delta for chunk in stream if chunk.choices]
    reasoning = [getattr(d, "reasoning_content", None) or "" for d in deltas]
    assert "".join(reasoning) == thinking
    assert "".join(d.content or "" for d in deltas) == content
    assert sum(1 for r in reasoning if r) > 1  # streamed as deltas

    answer = openai_client.chat.completions.create(
        model=NAME, messages=HI, reasoning_effort="high", temperature=0, max_tokens=80
    )
    message = answer.choices[0].message
    assert (message.model_extra.get("reasoning_content"), message.content) == (thinking, content)

    off = openai_client.chat.completions.create(
        model=NAME, messages=HI, reasoning_effort="none", temperature=0, max_tokens=80
    )
    assert "reasoning_content" not in off.choices[0].message.model_extra
    raw_off = raw_answer(ollama_client, HI, enable_thinking=False)
    assert off.choices[0].message.content == raw_off.lstrip()


def tool_call_in(raw: str) -> dict:
    """The call the model wrote after its thinking, read from the raw answer."""
    block = re.search(r"<tool_call>(.*?)</tool_call>", oracle(raw, inside=True)[1], re.DOTALL)
    assert block, f"the premise: the model calls the tool after thinking: {raw!r}"
    return json.loads(block.group(1))


def test_tool_calls_stream_after_the_thinking_through_openai(
    thinking_model, ollama_client, openai_client
):
    raw = raw_answer(ollama_client, PARIS, tools=WEATHER)
    thinking, _ = oracle(raw, inside=True)
    call = tool_call_in(raw)
    stream = openai_client.chat.completions.create(
        model=NAME, messages=PARIS, tools=WEATHER, stream=True, temperature=0, max_tokens=80
    )
    chunks = [chunk for chunk in stream if chunk.choices]
    deltas = [chunk.choices[0].delta for chunk in chunks]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == thinking
    assert "".join(d.content or "" for d in deltas) == ""
    calls = [c for d in deltas for c in d.tool_calls or []]
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        (call["name"], call["arguments"])
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_calls_stream_after_the_thinking_through_ollama(thinking_model, ollama_client):
    raw = raw_answer(ollama_client, PARIS, tools=WEATHER)
    thinking, _ = oracle(raw, inside=True)
    call = tool_call_in(raw)
    lines = list(ollama_client.chat(model=NAME, messages=PARIS, tools=WEATHER, think=True,
                                    stream=True, options=GREEDY))  # fmt: skip
    assert "".join(line.message.thinking or "" for line in lines) == thinking
    assert "".join(line.message.content for line in lines) == ""
    calls = [c for line in lines for c in line.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [
        (call["name"], call["arguments"])
    ]


def test_show_lists_the_thinking_capability(thinking_model, ollama_client):
    assert "thinking" in ollama_client.show(NAME).capabilities
    assert "thinking" not in (ollama_client.show(STARTER).capabilities or [])


def test_a_model_without_a_thinking_mode_refuses_to_think_but_takes_think_false(
    ollama_client, openai_client
):
    with pytest.raises(ollama.ResponseError) as refused:
        ollama_client.chat(model=STARTER, messages=HI, think=True, options=GREEDY)
    assert refused.value.status_code == 400
    assert f'"{STARTER}" does not support thinking' in refused.value.error
    answer = ollama_client.chat(model=STARTER, messages=HI, think=False, options=GREEDY)
    assert answer.message.content and answer.message.thinking is None
    with pytest.raises(openai.BadRequestError) as bad:
        openai_client.chat.completions.create(model=STARTER, messages=HI, reasoning_effort="low")
    assert bad.value.body["param"] == "reasoning_effort"
    with pytest.raises(ollama.ResponseError) as invalid:
        ollama_client.chat(model=STARTER, messages=HI, think="maximum")
    assert invalid.value.status_code == 400 and "think" in invalid.value.error


def test_constrained_output_goes_without_thinking(thinking_model, ollama_client, openai_client):
    # The block the template opens is closed, so the grammar's JSON is the answer, not thinking.
    room = {"temperature": 0, "num_predict": 300}  # a whole JSON object, not cut short
    answer = ollama_client.chat(model=NAME, messages=HI, format="json", options=room)
    assert answer.message.thinking is None
    assert isinstance(json.loads(answer.message.content), dict)
    with pytest.raises(ollama.ResponseError) as refused:
        ollama_client.chat(model=NAME, messages=HI, format="json", think=True)
    assert refused.value.status_code == 400 and "think" in refused.value.error
    reply = openai_client.chat.completions.create(
        model=NAME, messages=HI, response_format={"type": "json_object"}, temperature=0,
        max_tokens=300,
    )  # fmt: skip
    assert "reasoning_content" not in reply.choices[0].message.model_extra
    assert isinstance(json.loads(reply.choices[0].message.content), dict)
