"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions.

Streamed answers are server-sent events ending with `data: [DONE]`; the chunk that carries the
finish reason also carries `timings` (llama-server's names), and `stream_options.include_usage`
adds a last chunk with `usage`. Asked for, each chunk's `logprobs` are those of the tokens whose
text it carries (dashboard.api.logprobs). A refusal is an HTTP error before the stream begins;
an error after it has begun is an `error` event, which the openai client raises.
"""

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.http import HttpRequest, JsonResponse

from dashboard.api.answers import AnswerParser, Piece
from dashboard.api.auth import api_endpoint, app_id, caller_fields
from dashboard.api.errors import ApiError, from_event
from dashboard.api.logprobs import CompletionOffsets, openai_choice
from dashboard.api.openai_schemas import ChatCompletionRequest, CompletionRequest
from dashboard.api.prompts import chat_prompt, raw_prompt
from dashboard.api.runs import Run, api_request, resolve_model
from dashboard.api.schemas import parse_body
from dashboard.api.streaming import SSE_DONE, sse, stream_response
from dashboard.api.timings import openai_timings, openai_usage
from inference.models import LLMModel

openai_endpoint = api_endpoint(dialect="openai", methods=("POST",))


def finish_reason(engine_reason: str) -> str:
    # OpenAI knows stop and length; an answer cancelled on the appliance ended early: "stop".
    return "length" if engine_reason == "length" else "stop"


def model_entry(model: LLMModel) -> dict:
    return {"id": model.name, "object": "model", "created": int(model.created_at.timestamp()),
            "owned_by": "appliance"}  # fmt: skip


@api_endpoint(dialect="openai")
async def list_models(request: HttpRequest) -> JsonResponse:
    models = await sync_to_async(list)(LLMModel.objects.all())
    return JsonResponse({"object": "list", "data": [model_entry(m) for m in models]})


@api_endpoint(dialect="openai")
async def retrieve_model(request: HttpRequest, model_id: str) -> JsonResponse:
    return JsonResponse(model_entry(await resolve_model(model_id or "-")))


@dataclass(slots=True)
class Envelope:
    """What every response object and chunk of one request repeats."""

    id: str
    object: str
    created: int
    model: str

    def wrap(self, choices: list[dict], **extra) -> dict:
        return {"id": self.id, "object": self.object, "created": self.created,
                "model": self.model, "choices": choices, **extra}  # fmt: skip


def _start(run: Run, model_name: str, prefix: str, obj: str) -> Envelope:
    return Envelope(f"{prefix}-{run.id}", obj, int(time.time()), model_name)


async def _answer(run: Run) -> dict:
    """Wait for the whole answer; its done event (an error event raises)."""
    async for _ in run.events():
        pass
    if run.final is None or run.final["type"] != "done":
        raise from_event(run.final or {})
    return run.final


# --- chat --------------------------------------------------------------------------------


@openai_endpoint
async def chat_completions(request: HttpRequest):
    body = parse_body(request, ChatCompletionRequest)
    model = await resolve_model(body.model)
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    prompt = await chat_prompt(model, messages, body.active_tools, think=body.think,
                               think_param="reasoning_effort")  # fmt: skip
    sampling = prompt.constrain(body.sampling(), parallel=body.parallel_tool_calls is not False)
    asked = api_request(model, prompt.prompt, sampling,
                        **caller_fields(request, asked=body.priority))  # fmt: skip
    run = Run(model, asked, source="openai", client_name=request.api_key.name,
              app=app_id(request))  # fmt: skip
    await run.start()
    envelope = _start(run, body.model or model.name, "chatcmpl", "chat.completion")
    if body.stream:
        envelope.object = "chat.completion.chunk"
        chunks = _chat_chunks(run, envelope, prompt.answer_parser(), body.include_usage)
        return stream_response(chunks, "text/event-stream")
    done = await _answer(run)
    piece, calls = prompt.answer_parser().whole(done["text"])
    text = piece.content
    message: dict = {"role": "assistant", "content": text}
    if calls:
        message = {"role": "assistant", "content": text or None,
                   "tool_calls": [call.openai() for call in calls]}  # fmt: skip
    if piece.thinking:
        message["reasoning_content"] = piece.thinking  # llama-server's and DeepSeek's name
    reason = "tool_calls" if calls else finish_reason(done["finish_reason"])
    choice = {"index": 0, "message": message, "logprobs": openai_choice(run.take_logprobs()),
              "finish_reason": reason}  # fmt: skip
    return JsonResponse(envelope.wrap([choice], usage=openai_usage(done["figures"]),
                                      timings=openai_timings(done["figures"])))  # fmt: skip


async def _chat_chunks(
    run: Run, envelope: Envelope, parser: AnswerParser, include_usage: bool
) -> AsyncIterator[bytes]:
    extra = {"usage": None} if include_usage else {}

    def chunk(delta: dict, reason: str | None = None, **more) -> bytes:
        # A chunk carries the log-probabilities of the tokens whose text is out by now.
        choice = {"index": 0, "delta": delta, "logprobs": openai_choice(run.take_logprobs()),
                  "finish_reason": reason}  # fmt: skip
        return sse(envelope.wrap([choice], **extra, **more))

    # After each `yield` of output the chunk is on the socket: the first one is the TTFT
    # (dashboard.wire).
    sent = run.first_output.sent
    try:
        yield chunk({"role": "assistant", "content": ""})
        async for event in run.events():
            if event["type"] == "token":
                delta = _delta(parser.feed(event["text"]))
                if delta:
                    yield chunk(delta)
                    sent()
            elif event["type"] == "done":
                rest, calls = parser.finish()
                delta = _delta(rest)
                if delta:
                    yield chunk(delta)
                    sent()
                for index, call in enumerate(calls):
                    yield chunk({"tool_calls": [call.openai(index)]})
                    sent()
                figures = run.figures(event["figures"])
                reason = "tool_calls" if calls else finish_reason(event["finish_reason"])
                yield chunk({}, reason, timings=openai_timings(figures))
                if include_usage:
                    yield sse(envelope.wrap([], usage=openai_usage(figures),
                                            timings=openai_timings(figures)))  # fmt: skip
            elif event["type"] == "error":
                yield sse(from_event(event).body("openai"))
                return
        yield SSE_DONE
    finally:
        await run.close()  # a client that left mid-stream cancels its generation here


def _delta(piece: Piece) -> dict:
    """A chunk's delta: the thinking as `reasoning_content` (llama-server's, DeepSeek's and
    vLLM's field), the answer as `content`; only what the piece has."""
    delta = {"reasoning_content": piece.thinking} if piece.thinking else {}
    if piece.content:
        delta["content"] = piece.content
    return delta


# --- completions -------------------------------------------------------------------------


@openai_endpoint
async def completions(request: HttpRequest):
    body = parse_body(request, CompletionRequest)
    model = await resolve_model(body.model)
    asked = api_request(model, raw_prompt(model, body.prompt).prompt, body.sampling(),
                        **caller_fields(request, asked=body.priority))  # fmt: skip
    run = Run(model, asked, source="openai", client_name=request.api_key.name,
              app=app_id(request))  # fmt: skip
    await run.start()
    envelope = _start(run, body.model or model.name, "cmpl", "text_completion")
    if body.stream:
        return stream_response(_completion_chunks(run, envelope, body.include_usage),
                               "text/event-stream")  # fmt: skip
    done = await _answer(run)
    choice = {"index": 0, "text": done["text"],
              "logprobs": CompletionOffsets().shape(run.take_logprobs()),
              "finish_reason": finish_reason(done["finish_reason"])}  # fmt: skip
    return JsonResponse(envelope.wrap([choice], usage=openai_usage(done["figures"]),
                                      timings=openai_timings(done["figures"])))  # fmt: skip


async def _completion_chunks(
    run: Run, envelope: Envelope, include_usage: bool
) -> AsyncIterator[bytes]:
    extra = {"usage": None} if include_usage else {}
    offsets = CompletionOffsets()

    def chunk(text: str, reason: str | None = None, **more) -> bytes:
        choice = {"index": 0, "text": text, "logprobs": offsets.shape(run.take_logprobs()),
                  "finish_reason": reason}  # fmt: skip
        return sse(envelope.wrap([choice], **extra, **more))

    try:
        async for event in run.events():
            if event["type"] == "token" and event["text"]:
                yield chunk(event["text"])
                run.first_output.sent()  # on the socket now (dashboard.wire)
            elif event["type"] == "done":
                figures = run.figures(event["figures"])
                yield chunk("", finish_reason(event["finish_reason"]),
                            timings=openai_timings(figures))  # fmt: skip
                if include_usage:
                    yield sse(envelope.wrap([], usage=openai_usage(figures),
                                            timings=openai_timings(figures)))  # fmt: skip
            elif event["type"] == "error":
                yield sse(from_event(event).body("openai"))
                return
        yield SSE_DONE
    finally:
        await run.close()


__all__ = ["ApiError", "chat_completions", "completions", "list_models", "retrieve_model"]
