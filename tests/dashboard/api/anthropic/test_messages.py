"""Anthropic bodies to the prompt path's messages, and answers to Anthropic's shapes, without a
model: blocks mapped as chat completions' tool handling maps them, what the engine cannot do
refused naming the field, stop reasons and the streamed block events."""

import json

import pytest
from pydantic import ValidationError

from dashboard.api.answer_parser import Piece
from dashboard.api.anthropic.schemas import MessagesRequest
from dashboard.api.anthropic.views import _Blocks, stop_reason
from dashboard.api.bodies import validation_error
from dashboard.api.errors import ApiError
from dashboard.api.figures import anthropic_usage as usage
from dashboard.api.tools import ToolCall

TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}


def body(**fields) -> MessagesRequest:
    return MessagesRequest.model_validate_json(json.dumps({"max_tokens": 8, **fields}))


def refusal(**fields) -> ApiError:
    with pytest.raises(ValidationError) as raised:
        body(**fields)
    return validation_error(raised.value)


def test_a_tool_round_trip_becomes_tool_calls_and_tool_messages():
    asked = body(system=[{"type": "text", "text": "Be brief."}], tools=[TOOL], messages=[
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "I should call it.", "signature": "x"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"c": 1}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": [
                {"type": "text", "text": "Sunny"}]},
            {"type": "text", "text": "And tomorrow?"}]},
    ])  # fmt: skip
    assert asked.chat_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": "Checking.", "reasoning_content": "I should call it.",
         "tool_calls": [{"id": "toolu_1", "type": "function",
                         "function": {"name": "get_weather", "arguments": {"c": 1}}}]},
        {"role": "tool", "content": "Sunny", "tool_call_id": "toolu_1", "name": "get_weather"},
        {"role": "user", "content": "And tomorrow?"},
    ]  # fmt: skip
    assert asked.active_tools == [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object"}}}]  # fmt: skip
    assert asked.sampling() == {"max_tokens": 8}


def test_what_the_engine_cannot_do_is_refused_naming_the_field():
    document = refusal(messages=[{"role": "user", "content": [{"type": "document",
                                                               "source": {}}]}])  # fmt: skip
    assert "'document' are not supported" in document.message
    assert document.param == "messages.0.content"
    forced = refusal(messages=[{"role": "user", "content": "x"}], tools=[TOOL],
                     tool_choice={"type": "any"})  # fmt: skip
    assert forced.param == "tool_choice" and "cannot force" in forced.message
    with pytest.raises(ValidationError) as raised:
        MessagesRequest.model_validate_json('{"messages": [{"role": "user", "content": "x"}]}')
    assert validation_error(raised.value).param == "max_tokens"
    assert refusal(messages=[{"role": "user", "content": "x"}], temperature=1.5).param == (
        "temperature"
    )


def test_stop_reasons_and_usage_are_anthropics():
    call = ToolCall("get_weather", {}, "call_abc")
    assert stop_reason({"finish_reason": "stop"}, [call]) == "tool_use"
    assert stop_reason({"finish_reason": "length"}, []) == "max_tokens"
    assert stop_reason({"finish_reason": "stop", "stop": "END"}, []) == "stop_sequence"
    assert stop_reason({"finish_reason": "stop", "stop": None}, []) == "end_turn"
    assert usage({"prompt_tokens": 10, "cached_tokens": 4, "output_tokens": 3}) == {
        "input_tokens": 6, "output_tokens": 3, "cache_read_input_tokens": 4,
        "cache_creation_input_tokens": 0,
    }  # fmt: skip


def events(chunks: list[bytes]) -> list[dict]:
    out = []
    for chunk in chunks:
        name, data = chunk.decode().strip().split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        out.append(event)
    return out


def test_streamed_blocks_open_and_close_in_order_with_their_indexes():
    blocks = _Blocks()
    blocks.piece(Piece(thinking="hmm"))
    blocks.piece(Piece(thinking=" yes", content="Hi"))
    blocks.piece(Piece(content=" there"))
    blocks.stop()
    blocks.call(ToolCall("get_weather", {"city": "Paris"}, "call_abc"))
    got = [(e["type"], e.get("index"), e.get("delta", e.get("content_block")))
           for e in events(blocks.take())]  # fmt: skip
    assert got == [
        ("content_block_start", 0, {"type": "thinking", "thinking": "", "signature": ""}),
        ("content_block_delta", 0, {"type": "thinking_delta", "thinking": "hmm"}),
        ("content_block_delta", 0, {"type": "thinking_delta", "thinking": " yes"}),
        ("content_block_stop", 0, None),
        ("content_block_start", 1, {"type": "text", "text": ""}),
        ("content_block_delta", 1, {"type": "text_delta", "text": "Hi"}),
        ("content_block_delta", 1, {"type": "text_delta", "text": " there"}),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, {"type": "tool_use", "id": "toolu_abc",
                                    "name": "get_weather", "input": {}}),
        ("content_block_delta", 2, {"type": "input_json_delta",
                                    "partial_json": '{"city": "Paris"}'}),
        ("content_block_stop", 2, None),
    ]  # fmt: skip
