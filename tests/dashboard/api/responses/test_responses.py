"""The Responses API (/v1/responses) through the official openai package against the live
appliance: `responses.create` (text, instructions, message items, a tool call and its output,
a JSON schema, thinking) and `responses.stream()`, and the 400 for stored state.

The tool and thinking tests use the starter model's weights under few-shot templates (as
test_thinking does), so that the 135M model writes calls and thinking; what it writes is not
assumed: each test first has the same prompt answered raw, and compares."""

import json

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from inference.gguf.chat_template import render_chat
from tests.dashboard.api.server import STARTER
from tests.inference.text.thinking_templates import FEW_SHOT

pytestmark = pytest.mark.model

QUESTION = "Name a colour."
GREEDY = {"temperature": 0}

# Few-shot turns that call get_weather and then answer from its output; the conversation's own
# calls and outputs are rendered the same way, so a round trip reads as the examples do.
_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
_EXAMPLE = (
    "<|im_start|>user\nWeather in Paris?<|im_end|>\n"
    f"<|im_start|>assistant\n{_CALL}<|im_end|>\n"
    "<|im_start|>tool\nSunny, 21 C<|im_end|>\n"
    "<|im_start|>assistant\nIt is sunny in Paris, 21 C.<|im_end|>\n"
)
TOOL_FEW_SHOT = (
    "{{- '<|im_start|>system\\nYou can call tools: ' }}"
    "{%- for t in tools or [] %}{{- t.function.name + ' ' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- for i in range(3) %}{{- EXAMPLE }}{%- endfor %}"
    "{%- for m in messages %}{{- '<|im_start|>' + m.role + '\\n' + m.content }}"
    "{%- for c in m.tool_calls or [] %}"
    "{{- '<tool_call>\\n' + {'name': c.function.name, 'arguments': c.function.arguments} | tojson"
    " + '\\n</tool_call>' }}"
    "{%- endfor %}{{- '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
).replace("EXAMPLE", repr(_EXAMPLE))
WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}  # fmt: skip
PARIS = [{"role": "user", "content": "Weather in Paris?"}]

TWIN = """
from pathlib import Path
from django.conf import settings
from inference.models import LLMModel
starter = LLMModel.objects.get(name={starter!r})
link = Path(settings.MODELS_DIR) / "{name}.gguf"
link.unlink(missing_ok=True)
link.symlink_to(starter.file_path)
twin = LLMModel.objects.get(pk=starter.pk)
twin.pk, twin.name, twin.file_path, twin.is_default = None, {name!r}, str(link), False
twin.pulled_name = None
twin.chat_template_override = {template!r}
twin.save()
"""


def twin(appliance, name: str, template: str):
    """The starter model's weights registered again as `name` under `template`; deleted (its
    runner unloaded, its link removed) afterwards."""
    appliance.shell(TWIN.format(starter=STARTER, name=name, template=template))
    yield name
    httpx.request("DELETE", f"{appliance.url}/api/delete", json={"model": name},
                  headers=appliance.headers("admin-app"), timeout=120)  # fmt: skip


@pytest.fixture(scope="module")
def tool_model(appliance):
    yield from twin(appliance, "smollm2-tools", TOOL_FEW_SHOT)


@pytest.fixture(scope="module")
def thinking_model(appliance):
    yield from twin(appliance, "smollm2-thinks", FEW_SHOT)


@pytest.fixture
def client(appliance) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{appliance.url}/v1", api_key=appliance.keys["chat-app"],
                         max_retries=0, timeout=300)  # fmt: skip


def raw(client: openai.OpenAI, model: str, template: str, messages: list[dict], **variables):
    """The model's answer to the template's prompt sent raw (no splitting, no parsing)."""
    prompt = render_chat(template, messages, add_generation_prompt=True, **variables)
    return client.completions.create(model=model, prompt=prompt, max_tokens=80,
                                     **GREEDY).choices[0].text  # fmt: skip


def test_it_answers_a_string_input_with_usage_and_timings(client):
    response = client.responses.create(model=STARTER, input=QUESTION, max_output_tokens=40,
                                       **GREEDY)  # fmt: skip
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status in ("completed", "incomplete")
    assert response.store is False  # nothing is kept
    message = response.output[-1]
    assert message.type == "message" and message.role == "assistant"
    assert response.output_text and response.output_text == message.content[0].text
    usage = response.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= 40
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    timings = response.model_extra["timings"]
    assert timings["predicted_n"] == usage.output_tokens
    assert timings["prompt_n"] + timings["cache_n"] == usage.input_tokens
    chat = client.chat.completions.create(
        model=STARTER, messages=[{"role": "user", "content": QUESTION}], max_tokens=40, **GREEDY
    )
    assert response.output_text == chat.choices[0].message.content  # one prompt path


def test_instructions_and_message_items_are_the_chat_they_spell(client):
    system = "Answer in French."
    items = [
        {"role": "user", "content": "Hi"},
        {"type": "message", "role": "assistant",
         "content": [{"type": "output_text", "text": "Hello!", "annotations": []}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
    ]  # fmt: skip
    response = client.responses.create(model=STARTER, instructions=system, input=items,
                                       max_output_tokens=12, **GREEDY)  # fmt: skip
    messages = [{"role": "system", "content": system}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": QUESTION}]  # fmt: skip
    chat = client.chat.completions.create(model=STARTER, messages=messages, max_tokens=12,
                                          **GREEDY)  # fmt: skip
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    cut = response.status == "incomplete"
    assert cut == (chat.choices[0].finish_reason == "length")
    if cut:
        assert response.incomplete_details.reason == "max_output_tokens"


def test_a_tool_call_and_its_output_make_a_round_trip(client, tool_model):
    answer = raw(client, tool_model, TOOL_FEW_SHOT, PARIS, tools=[{"function": WEATHER}])
    assert answer.startswith("<tool_call>"), f"the premise: the model calls the tool: {answer!r}"
    response = client.responses.create(model=tool_model, input=PARIS, tools=[WEATHER],
                                       max_output_tokens=80, **GREEDY)  # fmt: skip
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", {"city": "Paris"})
    ]
    assert response.status == "completed" and calls[0].call_id.startswith("call_")

    # The usual loop: the output goes back in the input, with the function's result.
    follow_up = [*PARIS, *response.output,
                 {"type": "function_call_output", "call_id": calls[0].call_id,
                  "output": "Sunny, 21 C"}]  # fmt: skip
    final = client.responses.create(model=tool_model, input=follow_up, tools=[WEATHER],
                                    max_output_tokens=40, **GREEDY)  # fmt: skip
    messages = [*PARIS,
                {"role": "assistant", "content": "", "tool_calls": [
                    {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
                {"role": "tool", "content": "Sunny, 21 C"}]  # fmt: skip
    expected = raw(client, tool_model, TOOL_FEW_SHOT, messages, tools=[{"function": WEATHER}])
    assert final.output_text == expected.split("<|im_end|>")[0].strip()
    assert "sunny" in final.output_text.lower()
    assert not [item for item in final.output if item.type == "function_call"]


def test_a_json_schema_format_holds_the_output_to_the_schema(client):
    task = {"type": "object", "additionalProperties": False, "required": ["device", "state"],
            "properties": {"device": {"type": "string", "maxLength": 16},
                           "state": {"enum": ["on", "off"]}}}  # fmt: skip
    ask = "Turn the kitchen lamp on. Answer as JSON."
    response = client.responses.create(
        model=STARTER, input=ask, max_output_tokens=80, **GREEDY,
        text={"format": {"type": "json_schema", "name": "task", "schema": task, "strict": True}},
    )  # fmt: skip
    assert response.status == "completed"
    jsonschema.validate(json.loads(response.output_text), task)

    class Lamp(BaseModel):  # the SDK's parse() sends the model's schema, strict
        device: str
        on: bool

    parsed = client.responses.parse(model=STARTER, input=ask, text_format=Lamp,
                                    max_output_tokens=80, **GREEDY)  # fmt: skip
    assert isinstance(parsed.output_parsed, Lamp)


def test_stored_state_is_refused_with_a_400_that_says_so(client):
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=STARTER, input=QUESTION, previous_response_id="resp_x")
    assert refused.value.body["param"] == "previous_response_id"
    assert "stateless" in refused.value.body["message"]
    with pytest.raises(openai.BadRequestError) as no_tool:
        client.responses.create(model=STARTER, input=QUESTION, tools=[{"type": "web_search"}])
    assert "function tools only" in no_tool.value.body["message"]


def test_it_streams_deltas_that_join_to_the_final_output_text(client):
    with client.responses.stream(model=STARTER, input=QUESTION, max_output_tokens=60,
                                 **GREEDY) as stream:  # fmt: skip
        events = list(stream)
        final = stream.get_final_response()
    kinds = [event.type for event in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed", "the premise: the answer ends within 60 tokens"
    assert [event.sequence_number for event in events] == list(range(len(events)))
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == final.output_text
    whole = client.responses.create(model=STARTER, input=QUESTION, max_output_tokens=60,
                                    **GREEDY)  # fmt: skip
    assert final.output_text == whole.output_text
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert final.model_extra["timings"]["predicted_n"] == final.usage.output_tokens


def test_a_stream_cut_short_ends_incomplete_with_its_text(client):
    with client.responses.stream(model=STARTER, input="Tell me about cats.",
                                 max_output_tokens=3, **GREEDY) as stream:  # fmt: skip
        events = list(stream)
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.incomplete_details.reason == "max_output_tokens"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas and deltas == last.response.output_text
    assert last.response.usage.output_tokens == 3
    # As against OpenAI (the README says so): this SDK keeps only response.completed as final.
    with pytest.raises(RuntimeError, match="response.completed"):
        stream.get_final_response()


def test_thinking_comes_as_a_reasoning_item_streamed_and_not(client, thinking_model):
    answer = raw(client, thinking_model, FEW_SHOT, [{"role": "user", "content": "Hi"}])
    thinking, closed, content = answer.partition("</think>")
    assert closed, f"the premise: the model thinks, then answers: {answer!r}"
    response = client.responses.create(model=thinking_model, input="Hi", max_output_tokens=80,
                                       reasoning={"effort": "medium"}, **GREEDY)  # fmt: skip
    reasoning, message = response.output
    assert reasoning.type == "reasoning" and reasoning.content[0].text == thinking.strip()
    assert response.output_text == content.split("<|im_end|>")[0].strip()
    assert 0 < response.usage.output_tokens_details.reasoning_tokens < response.usage.output_tokens

    with client.responses.stream(model=thinking_model, input="Hi", max_output_tokens=80,
                                 **GREEDY) as stream:  # fmt: skip
        events = list(stream)
        final = stream.get_final_response()
    streamed = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    assert streamed == thinking.strip()
    assert final.output_text == response.output_text

    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(model=STARTER, input="Hi", reasoning={"effort": "high"})
    assert refused.value.body["param"] == "reasoning"
