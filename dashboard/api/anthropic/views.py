"""Anthropic-compatible endpoints: /v1/messages and /v1/messages/count_tokens.

The conversation goes through the answer pipeline as chat completions' does
(dashboard.api.pipeline: the model's template, its tools and thinking mode, the same answer
parser), so only the shapes differ: an answer is a list of content blocks (thinking, text,
tool_use).

Streamed answers are server-sent events named by their type, in the order the anthropic
client's `messages.stream()` consumes: message_start, ping, then per block content_block_start,
content_block_delta (text_delta, thinking_delta, input_json_delta) and content_block_stop, then
message_delta (stop_reason, usage) and message_stop. A refusal is an HTTP error before the
stream begins; an error after it has begun is an `error` event, which the client raises.

Usage is Anthropic's (dashboard.api.figures.anthropic_usage); `timings` rides beside it.
"""

import json
from dataclasses import dataclass, field

from django.conf import settings
from django.http import HttpRequest, JsonResponse

from dashboard.api import pipeline
from dashboard.api.answer_parser import Piece
from dashboard.api.anthropic.schemas import CountTokensRequest, MessagesRequest
from dashboard.api.auth import api_endpoint
from dashboard.api.bodies import parse_body
from dashboard.api.errors import ApiError
from dashboard.api.figures import anthropic_usage, timings
from dashboard.api.pipeline import Answer, Ending
from dashboard.api.streaming import sse_event
from dashboard.api.tools import ToolCall

# Both take images, so bodies up to MAX_IMAGE_BODY_BYTES.
anthropic_endpoint = api_endpoint(dialect="anthropic", methods=("POST",),
                                  max_body=settings.MAX_IMAGE_BODY_BYTES)  # fmt: skip


def stop_reason(done: dict, calls: list[ToolCall]) -> str:
    if calls:
        return "tool_use"
    if done["finish_reason"] == "length":
        return "max_tokens"
    return "stop_sequence" if done.get("stop") else "end_turn"


def tool_use(call: ToolCall, input_: dict | None = None) -> dict:
    tool_id = "toolu_" + call.id.removeprefix("call_")
    return {"type": "tool_use", "id": tool_id, "name": call.name,
            "input": call.arguments if input_ is None else input_}  # fmt: skip


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


class MessagesWriter:
    content_type = "text/event-stream"

    def __init__(self, answer: Answer):
        self.answer = answer
        self.shell = {"id": f"msg_{answer.id}", "type": "message", "role": "assistant",
                      "model": answer.name, "content": [], "stop_reason": None,
                      "stop_sequence": None}  # fmt: skip
        self.blocks = _Blocks()
        self.started = False

    def opening(self) -> list[bytes]:
        # message_start waits for the first output: its usage counts the prompt, as
        # Anthropic's does, and the engine says the prompt's size when it admits the request.
        return []

    def start(self) -> list[bytes]:
        """message_start and a ping, before the first block (once)."""
        if self.started:
            return []
        self.started = True
        run = self.answer.run
        usage = anthropic_usage({"prompt_tokens": run.prompt_tokens,
                                 "cached_tokens": run.cached_tokens})  # fmt: skip
        return [sse_event({"type": "message_start", "message": {**self.shell, "usage": usage}}),
                sse_event({"type": "ping"})]  # fmt: skip

    def piece(self, piece: Piece) -> list[bytes]:
        self.blocks.piece(piece)
        chunks = self.blocks.take()
        return [*self.start(), *chunks] if chunks else chunks

    def ending(self, end: Ending) -> list[bytes]:
        opening = self.start()
        blocks = self.blocks
        blocks.piece(end.text)
        if blocks.count == 0 and blocks.open is None and not end.calls:
            blocks.start({"type": "text", "text": ""})  # an empty answer: one block
        blocks.stop()
        for call in end.calls:
            blocks.call(call)
        return [*opening, *blocks.take(), sse_event({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(end.done, end.calls), "stop_sequence": end.stop},
            "usage": anthropic_usage(end.figures), "timings": timings(end.figures),
        }), sse_event({"type": "message_stop"})]  # fmt: skip

    def failure(self, error: ApiError) -> list[bytes]:
        return [sse_event(error.body("anthropic"))]

    def final(self, end: Ending) -> dict:
        content: list[dict] = []
        if end.text.thinking:
            content.append({"type": "thinking", "thinking": end.text.thinking, "signature": ""})
        if end.text.content or not end.calls:
            content.append({"type": "text", "text": end.text.content})
        content.extend(tool_use(call) for call in end.calls)
        return {**self.shell, "content": content, "stop_reason": stop_reason(end.done, end.calls),
                "stop_sequence": end.stop, "usage": anthropic_usage(end.figures),
                "timings": timings(end.figures)}  # fmt: skip


@anthropic_endpoint
async def messages(request: HttpRequest):
    body = parse_body(request, MessagesRequest)
    answer = await pipeline.start(request, body.ask(), source="anthropic")
    return await pipeline.respond(answer, MessagesWriter(answer), streamed=body.stream)


@anthropic_endpoint
async def count_tokens(request: HttpRequest) -> JsonResponse:
    """The tokens of the prompt /v1/messages would send for this conversation (its template,
    tools and thinking switch, its images), counted by the model's own tokenizer and projector
    in its runner (each picture decoded and read, not encoded): the input_tokens plus
    cache_read_input_tokens of that answer."""
    body = parse_body(request, CountTokensRequest)
    ask = body.ask()
    model = await pipeline.resolve_model(ask.model)
    prompt = await pipeline.render(model, ask)
    return JsonResponse({"input_tokens": await pipeline.count_prompt_tokens(model, prompt.prompt)})


__all__ = ["ApiError", "count_tokens", "messages"]
