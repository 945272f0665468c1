"""The Responses API's shapes without a model: a request's input as chat messages, and an
answer's stream events as the openai SDK reads them (each event and the response validated
against the SDK's own types, and fed through the state machine behind `responses.stream()`)."""

import json

import pytest
from openai import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter, ValidationError

from dashboard.api.answer_parser import AnswerParser, Piece
from dashboard.api.pipeline import Ending
from dashboard.api.responses.events import ResponseBuilder
from dashboard.api.responses.schemas import ResponsesRequest
from dashboard.api.tools import ToolCallParser
from inference.text.thinking import ThinkingSplitter

EVENT = TypeAdapter(ResponseStreamEvent)
FIGURES = {"prompt_tokens": 12, "output_tokens": 7, "cached_tokens": 4}


def request(**fields) -> ResponsesRequest:
    return ResponsesRequest.model_validate_json(json.dumps({"input": "Hi", **fields}))


def build(pieces: list[str], reason: str = "stop", *, thinking=False, tools=None, **fields):
    """The builder's events for an answer written in `pieces` (split as the answer pipeline
    splits them), and the builder."""
    body = request(**({"tools": tools} if tools else {}), **fields)
    splitter = ThinkingSplitter(inside=True) if thinking else None
    names = {tool["name"] for tool in tools or ()}
    parser = AnswerParser(splitter, ToolCallParser(names) if names else None)
    builder = ResponseBuilder("resp_1", "m", body)
    events = builder.opening()
    for piece in pieces:
        events += builder.piece(parser.feed(piece))
    rest, calls = parser.finish()
    figures = {**FIGURES, "reasoning_tokens": parser.thinking_tokens}
    events += builder.finish(Ending(rest, calls, {"finish_reason": reason}, figures))
    return events, builder


def consumed(events: list[dict]) -> tuple[list, Response | None]:
    """What responses.stream() yields for these events, and its get_final_response()."""
    state = ResponseStreamState(input_tools=omit, text_format=omit)
    out = []
    for event in events:
        out += state.handle_event(EVENT.validate_python(event))
    return out, state._completed_response


def test_a_string_input_and_instructions_are_a_system_and_a_user_message():
    assert request(instructions="Be brief.").chat_messages() == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
    ]


def test_output_items_passed_back_become_the_assistant_turn_and_its_tool_messages():
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "They want light."}]},
        {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
         "content": [{"type": "output_text", "text": "On it.", "annotations": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "light",
         "arguments": '{"on": true}', "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": "done"},
    ]  # fmt: skip
    assert request(input=items).chat_messages() == [
        {"role": "developer", "content": "Rules."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "On it.", "reasoning_content": "They want light.",
         "tool_calls": [{"id": "call_1", "type": "function",
                         "function": {"name": "light", "arguments": '{"on": true}'}}]},
        {"role": "tool", "content": "done", "tool_call_id": "call_1", "name": "light"},
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"previous_response_id": "resp_x"}, "previous_response_id is not supported"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "item references"),
        ({"background": True}, "background is not supported"),
        ({"tools": [{"type": "web_search"}]}, "function tools only"),
        ({"tool_choice": "required"}, "cannot force a tool call"),
        ({"input": [{"role": "user", "content": [{"type": "input_file"}]}]},
         "text and input_image"),
        ({"include": ["message.output_text.logprobs"]}, "logprobs"),
        ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "needs a schema"),
        ({"reasoning": {"effort": "high"}, "text": {"format": {"type": "json_object"}}},
         "reasoning cannot be combined"),
    ],
)  # fmt: skip
def test_what_a_stateless_text_engine_cannot_do_is_refused(fields, named):
    with pytest.raises(ValidationError, match=named):
        request(**fields)


def test_store_is_accepted_and_the_response_says_it_was_not_kept():
    _, builder = build(["Hello"], store=True)
    assert builder.response()["store"] is False


def test_the_stream_is_what_the_sdk_consumes_and_ends_in_the_whole_response():
    events, builder = build(["Hel", "lo", " there"])
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    yielded, final = consumed(events)
    deltas = [e.delta for e in yielded if e.type == "response.output_text.delta"]
    assert deltas == ["Hel", "lo", " there"]
    assert final.output_text == "Hello there" and final.status == "completed"
    whole = Response.model_validate(builder.response())
    assert whole.output_text == "Hello there"
    assert whole.usage.input_tokens == 12 and whole.usage.total_tokens == 19
    assert whole.usage.input_tokens_details.cached_tokens == 4
    assert whole.model_extra["timings"]["predicted_n"] == 7
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip


def test_an_answer_cut_short_is_incomplete():
    events, builder = build(["Once upon"], "length")
    assert events[-1]["type"] == "response.incomplete"
    response = Response.model_validate(builder.response())
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.output[0].status == "incomplete"


def test_thinking_is_a_reasoning_item_before_the_message_and_counted():
    events, builder = build(["Let me", " see.</think>", "\n\nYes."], thinking=True)
    _, final = consumed(events)
    response = Response.model_validate(builder.response())
    assert [item.type for item in response.output] == ["reasoning", "message"]
    assert response.output[0].content[0].text == "Let me see."
    assert response.output_text == final.output_text == "Yes."
    assert response.usage.output_tokens_details.reasoning_tokens == 2


LIGHT = {"type": "function", "name": "light", "parameters": {"type": "object"}}


def test_tool_calls_are_function_call_items_with_their_arguments_streamed():
    call = '<tool_call>{"name": "light", "arguments": {"on": true}}</tool_call>'
    events, builder = build(["Sure. ", call], tools=[LIGHT])
    yielded, final = consumed(events)
    calls = [item for item in final.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("light", {"on": True})]
    assert calls[0].call_id.startswith("call_")
    assert final.output_text == "Sure. "
    kinds = [e.type for e in yielded]
    assert "response.function_call_arguments.done" in kinds
    response = Response.model_validate(builder.response())
    assert response.tools[0].name == "light"


def test_an_answer_of_only_a_call_has_no_message():
    call = '<tool_call>{"name": "light", "arguments": {}}</tool_call>'
    _, builder = build([call], tools=[LIGHT])
    assert [item["type"] for item in builder.response()["output"]] == ["function_call"]


def test_an_error_after_the_stream_began_is_an_error_event_and_response_failed():
    from dashboard.api.errors import ApiError

    body = request()
    builder = ResponseBuilder("resp_1", "m", body)
    events = builder.opening() + builder.piece(Piece(content="Hi"))
    events += builder.fail(ApiError(500, "boom"))
    yielded, final = consumed(events)
    assert [e.type for e in yielded][-2:] == ["error", "response.failed"]
    assert yielded[-2].message == "boom" and final is None
    assert yielded[-1].response.error.message == "boom"


def test_a_json_format_is_the_grammar_response_format_would_give():
    from dashboard.api.openai.schemas import ResponseFormat

    assert request(text={"format": {"type": "json_object"}}).sampling()["grammar"] == (
        ResponseFormat(type="json_object").grammar()
    )
    schema = {"type": "object", "properties": {"on": {"type": "boolean"}}}
    flat = {"type": "json_schema", "name": "lamp", "schema": schema}
    nested = ResponseFormat.model_validate(
        {"type": "json_schema", "json_schema": {"name": "lamp", "schema": schema}}
    )
    assert request(text={"format": flat}).sampling()["grammar"] == nested.grammar()
    assert request(text={"format": flat}, reasoning={"effort": "none"}).think is False
