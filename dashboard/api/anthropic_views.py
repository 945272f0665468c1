"""Anthropic-compatible endpoints: /v1/messages and /v1/messages/count_tokens.

The conversation goes through the same prompt path as chat completions (chat_prompt: the
model's template, its tools and thinking mode), the answer through the same AnswerParser, so
only the shapes differ: an answer is a list of content blocks (thinking, text, tool_use).

Streamed answers are server-sent events named by their type, in the order the anthropic
client's `messages.stream()` consumes: message_start, ping, then per block content_block_start,
content_block_delta (text_delta, thinking_delta, input_json_delta) and content_block_stop, then
message_delta (stop_reason, usage) and message_stop. A refusal is an HTTP error before the
stream begins; an error after it has begun is an `error` event, which the client raises.

Usage is Anthropic's: input_tokens are the prompt tokens the prefill computed, and
cache_read_input_tokens those reused from the prefix cache (their sum is the prompt).
"""

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from django.http import HttpRequest, JsonResponse

from dashboard.api.answers import AnswerParser, Piece
from dashboard.api.anthropic_schemas import CountTokensRequest, MessagesRequest
from dashboard.api.auth import api_endpoint, app_id, caller_fields
from dashboard.api.errors import ApiError, from_event
from dashboard.api.prompts import chat_prompt
from dashboard.api.runs import Run, api_request, resolve_model
from dashboard.api.schemas import parse_body
from dashboard.api.streaming import dumps, stream_response
from dashboard.api.timings import evaluated_prompt_tokens, openai_timings
from dashboard.api.tokens import count_prompt_tokens
from dashboard.api.tools import ToolCall

anthropic_endpoint = api_endpoint(dialect="anthropic", methods=("POST",))


def sse_event(data: dict) -> bytes:
    """One server-sent event named by its payload's type, as Anthropic streams them."""
    return f"event: {data['type']}\ndata: {dumps(data)}\n\n".encode()


def stop_reason(done: dict, calls: list[ToolCall]) -> str:
    if calls:
        return "tool_use"
    if done["finish_reason"] == "length":
        return "max_tokens"
    return "stop_sequence" if done.get("stop") else "end_turn"


def usage(figures: dict) -> dict:
    return {"input_tokens": evaluated_prompt_tokens(figures),
            "output_tokens": figures.get("output_tokens") or 0,
            "cache_read_input_tokens": figures.get("cached_tokens") or 0,
            "cache_creation_input_tokens": 0}  # fmt: skip


def tool_use(call: ToolCall, input_: dict | None = None) -> dict:
    tool_id = "toolu_" + call.id.removeprefix("call_")
    return {"type": "tool_use", "id": tool_id, "name": call.name,
            "input": call.arguments if input_ is None else input_}  # fmt: skip


def message_shell(run: Run, model_name: str) -> dict:
    return {"id": f"msg_{run.id}", "type": "message", "role": "assistant", "model": model_name,
            "content": [], "stop_reason": None, "stop_sequence": None}  # fmt: skip


async def _conversation(body: CountTokensRequest):
    model = await resolve_model(body.model)
    prompt = await chat_prompt(model, body.template_messages(), body.active_tools,
                               think=body.think, think_param="thinking")  # fmt: skip
    return model, prompt


@anthropic_endpoint
async def messages(request: HttpRequest):
    body = parse_body(request, MessagesRequest)
    model, prompt = await _conversation(body)
    sampling = prompt.constrain(body.sampling(), parallel=body.parallel_tool_calls)
    asked = api_request(model, prompt.prompt, sampling, **caller_fields(request))
    run = Run(model, asked, source="anthropic", client_name=request.api_key.name,
              app=app_id(request))  # fmt: skip
    await run.start()
    shell = message_shell(run, body.model or model.name)
    if body.stream:
        return stream_response(_events(run, shell, prompt.answer_parser()), "text/event-stream")
    async for _ in run.events():
        pass
    done = run.final
    if done is None or done["type"] != "done":
        raise from_event(done or {})
    piece, calls = prompt.answer_parser().whole(done["text"])
    content: list[dict] = []
    if piece.thinking:
        content.append({"type": "thinking", "thinking": piece.thinking, "signature": ""})
    if piece.content or not calls:
        content.append({"type": "text", "text": piece.content})
    content.extend(tool_use(call) for call in calls)
    return JsonResponse({**shell, "content": content, "stop_reason": stop_reason(done, calls),
                         "stop_sequence": done.get("stop"), "usage": usage(done["figures"]),
                         "timings": openai_timings(done["figures"])})  # fmt: skip


@dataclass(slots=True)
class _Blocks:
    """The content blocks of a streamed answer: which one is open, and how many came before."""

    open: str | None = None  # "thinking" or "text"
    count: int = 0
    out: list[bytes] = field(default_factory=list)

    def start(self, block: dict) -> None:
        self.stop()
        self.open = block["type"]
        self.out.append(sse_event({"type": "content_block_start", "index": self.count,
                                   "content_block": block}))  # fmt: skip

    def delta(self, delta: dict) -> None:
        self.out.append(sse_event({"type": "content_block_delta", "index": self.count,
                                   "delta": delta}))  # fmt: skip

    def stop(self) -> None:
        if self.open is not None:
            self.out.append(sse_event({"type": "content_block_stop", "index": self.count}))
            self.open = None
            self.count += 1

    def piece(self, piece: Piece) -> None:
        if piece.thinking:
            if self.open != "thinking":
                self.start({"type": "thinking", "thinking": "", "signature": ""})
            self.delta({"type": "thinking_delta", "thinking": piece.thinking})
        if piece.content:
            if self.open != "text":
                self.start({"type": "text", "text": ""})
            self.delta({"type": "text_delta", "text": piece.content})

    def call(self, call: ToolCall) -> None:
        self.start(tool_use(call, {}))
        self.delta({"type": "input_json_delta", "partial_json": json.dumps(call.arguments)})
        self.stop()

    def take(self) -> list[bytes]:
        out, self.out = self.out, []
        return out


async def _events(run: Run, shell: dict, parser: AnswerParser) -> AsyncIterator[bytes]:
    blocks = _Blocks()
    try:
        empty = {"input_tokens": 0, "output_tokens": 0}
        yield sse_event({"type": "message_start", "message": {**shell, "usage": empty}})
        yield sse_event({"type": "ping"})
        async for event in run.events():
            if event["type"] == "token":
                blocks.piece(parser.feed(event["text"]))
            elif event["type"] == "done":
                rest, calls = parser.finish()
                blocks.piece(rest)
                if blocks.count == 0 and blocks.open is None and not calls:
                    blocks.start({"type": "text", "text": ""})  # an empty answer: one block
                blocks.stop()
                for call in calls:
                    blocks.call(call)
                for chunk in blocks.take():
                    yield chunk
                figures = event["figures"]
                yield sse_event({
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason(event, calls),
                              "stop_sequence": event.get("stop")},
                    "usage": usage(figures), "timings": openai_timings(figures),
                })  # fmt: skip
                yield sse_event({"type": "message_stop"})
                return
            elif event["type"] == "error":
                yield sse_event(from_event(event).body("anthropic"))
                return
            for chunk in blocks.take():
                yield chunk
    finally:
        await run.close()  # a client that left mid-stream cancels its generation here


@anthropic_endpoint
async def count_tokens(request: HttpRequest) -> JsonResponse:
    """The tokens of the prompt /v1/messages would send for this conversation (its template,
    tools and thinking switch), counted by the model's own tokenizer in its runner: the
    input_tokens plus cache_read_input_tokens of that answer."""
    body = parse_body(request, CountTokensRequest)
    model, prompt = await _conversation(body)
    return JsonResponse({"input_tokens": await count_prompt_tokens(model, prompt.prompt)})


__all__ = ["ApiError", "count_tokens", "messages"]
