"""OpenAI-compatible endpoints: /v1/models, /v1/chat/completions, /v1/completions and
/v1/embeddings.

A generation goes through the answer pipeline (dashboard.api.pipeline); what is OpenAI's is
written here: streamed answers are server-sent events ending with `data: [DONE]`; the chunk that
carries the finish reason also carries `timings` (dashboard.api.figures), and
`stream_options.include_usage` adds a last chunk with `usage`. Asked for, each chunk's
`logprobs` are those of the tokens whose text it carries (dashboard.api.logprobs). A refusal is
an HTTP error before the stream begins; an error after it has begun is an `error` event, which
the openai client raises.
"""

import asyncio
import time
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, JsonResponse

from dashboard.api import pipeline
from dashboard.api.answer_parser import Piece
from dashboard.api.auth import api_endpoint
from dashboard.api.bodies import parse_body
from dashboard.api.embedding import check_dimensions, embed
from dashboard.api.errors import ApiError
from dashboard.api.figures import openai_usage, timings
from dashboard.api.logprobs import CompletionOffsets, openai_choice
from dashboard.api.ollama.shapes import capabilities
from dashboard.api.openai.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    OpenAIEmbeddingRequest,
    OpenAISampling,
)
from dashboard.api.pipeline import Answer, Ending
from dashboard.api.streaming import SSE_DONE, merged, sse, stream_response
from inference.models import LLMModel

openai_endpoint = api_endpoint(dialect="openai", methods=("POST",))


def finish_reason(engine_reason: str) -> str:
    # OpenAI knows stop and length; an answer cancelled on the appliance ended early: "stop".
    return "length" if engine_reason == "length" else "stop"


def model_entry(model: LLMModel) -> dict:
    # What it takes and gives, in the shape llama-server's model list (and OpenRouter's) uses:
    # OpenAI's own model object has no place for it.
    inputs = ["text", "image"] if model.takes_images else ["text"]
    modalities = {"input_modalities": inputs, "output_modalities": ["text"]}
    return {"id": model.name, "object": "model", "created": int(model.created_at.timestamp()),
            "owned_by": "appliance", "architecture": modalities,
            # As llama-server's model list has them (Ollama's names; "rerank" for a reranker).
            "capabilities": capabilities(model)}  # fmt: skip


@api_endpoint(dialect="openai")
async def list_models(request: HttpRequest) -> JsonResponse:
    models = await sync_to_async(list)(LLMModel.objects.select_related("base"))
    return JsonResponse({"object": "list", "data": [model_entry(m) for m in models]})


@api_endpoint(dialect="openai")
async def retrieve_model(request: HttpRequest, model_id: str) -> JsonResponse:
    return JsonResponse(model_entry(await pipeline.resolve_model(model_id or "-")))


@dataclass(slots=True)
class Envelope:
    """What every response object and chunk of one answer repeats."""

    id: str
    object: str
    created: int
    model: str

    def wrap(self, choices: list[dict], **extra) -> dict:
        return {"id": self.id, "object": self.object, "created": self.created,
                "model": self.model, "choices": choices, **extra}  # fmt: skip


class OpenAIWriter:
    """What chat and completions write alike: the envelope, the finish chunk with `timings`,
    the usage chunk when asked, [DONE], and an error as an `error` event."""

    content_type = "text/event-stream"
    prefix = ""  # of the answer's id
    object = chunk_object = ""  # of the whole answer, and of each chunk of a streamed one
    empty: dict = {}  # a choice's fields in the chunk that only says the finish reason

    def __init__(self, answer: Answer, body: OpenAISampling, *, index: int = 0,
                 envelope: Envelope | None = None):  # fmt: skip
        """`index`: the choice it writes; one of several (n > 1) shares the first's envelope,
        and the stream's usage chunk and [DONE] come once all have ended (choices_stream)."""
        self.answer = answer
        self.index = index
        kind = self.chunk_object if body.stream else self.object
        self.envelope = envelope or Envelope(f"{self.prefix}-{answer.id}", kind,
                                             int(time.time()), answer.name)  # fmt: skip
        self.alone = body.n == 1
        self.include_usage = body.include_usage
        self._extra = {"usage": None} if self.include_usage else {}
        self.end: Ending | None = None  # once it has ended

    def choice(self, **fields) -> dict:
        raise NotImplementedError

    def chunk(self, reason: str | None = None, more: dict | None = None, **fields) -> bytes:
        choice = {"index": self.index, **self.choice(**fields), "finish_reason": reason}
        return sse(self.envelope.wrap([choice], **self._extra, **(more or {})))

    def closing(self, end: Ending, reason: str) -> list[bytes]:
        self.end = end
        chunks = [self.chunk(reason, {"timings": timings(end.figures)}, **self.empty)]
        return [*chunks, *self.after([end])] if self.alone else chunks

    def after(self, ends: list[Ending]) -> list[bytes]:
        """What follows the last choice's finish: the usage chunk when asked, and [DONE]."""
        if not self.include_usage:
            return [SSE_DONE]
        usage = sse(self.envelope.wrap([], usage=choices_usage(ends),
                                       timings=timings(ends[0].figures)))  # fmt: skip
        return [usage, SSE_DONE]

    def failure(self, error: ApiError) -> list[bytes]:
        return [sse(error.body("openai"))]

    def response(self, choice: dict, end: Ending) -> dict:
        return self.envelope.wrap([choice], usage=openai_usage(end.figures),
                                  timings=timings(end.figures))  # fmt: skip


def choices_usage(ends: list[Ending]) -> dict:
    """The usage of n choices: the prompt once (as OpenAI counts it), the tokens of them all."""
    usage = openai_usage(ends[0].figures)
    completion = sum(openai_usage(end.figures)["completion_tokens"] for end in ends)
    return {**usage, "completion_tokens": completion,
            "total_tokens": usage["prompt_tokens"] + completion}  # fmt: skip


async def respond(request: HttpRequest, body: OpenAISampling, writer_class: type[OpenAIWriter]):
    """Chat's and completions' answer: one choice through the pipeline, or n side by side."""
    answers = await pipeline.start_choices(request, body.ask(), source="openai")
    first = writer_class(answers[0], body)
    if len(answers) == 1:
        return await pipeline.respond(answers[0], first, streamed=body.stream)
    writers = [first] + [writer_class(answer, body, index=index, envelope=first.envelope)
                         for index, answer in enumerate(answers[1:], start=1)]  # fmt: skip
    if body.stream:
        return stream_response(choices_stream(answers, writers), first.content_type)
    # Each whole() reads its answer to the end and closes its run, whatever happens to the
    # others; the first error is the response's.
    objects = await asyncio.gather(*(pipeline.whole(answer, writer)
                                     for answer, writer in zip(answers, writers, strict=True)),
                                   return_exceptions=True)  # fmt: skip
    for result in objects:
        if isinstance(result, BaseException):
            raise result
    ends = [writer.end for writer in writers]
    return JsonResponse(first.envelope.wrap(
        [choice for obj in objects for choice in obj["choices"]],
        usage=choices_usage(ends), timings=timings(ends[0].figures)))  # fmt: skip


async def choices_stream(answers: list[Answer], writers: list[OpenAIWriter]):
    """n choices' chunks as they come, then the usage chunk (when asked) and [DONE] once. A
    chunk's TTFT stamp is taken when it is handed to the merge, not the socket (a hair early)."""
    streams = [pipeline.stream(a, w) for a, w in zip(answers, writers, strict=True)]
    async for chunk in merged(streams):
        yield chunk
    ends = [writer.end for writer in writers]
    if all(end is not None for end in ends):  # else one failed: its error event is out
        for chunk in writers[0].after(ends):
            yield chunk


# --- chat --------------------------------------------------------------------------------


def _delta(piece: Piece) -> dict:
    """A chunk's delta: the thinking as `reasoning_content` (llama-server's, DeepSeek's and
    vLLM's field), the answer as `content`; only what the piece has."""
    delta = {"reasoning_content": piece.thinking} if piece.thinking else {}
    if piece.content:
        delta["content"] = piece.content
    return delta


class ChatWriter(OpenAIWriter):
    prefix, object, chunk_object = "chatcmpl", "chat.completion", "chat.completion.chunk"
    empty = {"delta": {}}

    def choice(self, delta: dict) -> dict:
        # A chunk carries the log-probabilities of the tokens whose text is out by now.
        return {"delta": delta, "logprobs": openai_choice(self.answer.take_logprobs())}

    def opening(self) -> list[bytes]:
        return [self.chunk(delta={"role": "assistant", "content": ""})]

    def piece(self, piece: Piece) -> list[bytes]:
        delta = _delta(piece)
        return [self.chunk(delta=delta)] if delta else []

    def ending(self, end: Ending) -> list[bytes]:
        chunks = self.piece(end.text)
        chunks += [self.chunk(delta={"tool_calls": [call.openai(index)]})
                   for index, call in enumerate(end.calls)]  # fmt: skip
        reason = "tool_calls" if end.calls else finish_reason(end.finish_reason)
        return chunks + self.closing(end, reason)

    def final(self, end: Ending) -> dict:
        text = end.text.content
        message: dict = {"role": "assistant", "content": text}
        if end.calls:
            message = {"role": "assistant", "content": text or None,
                       "tool_calls": [call.openai() for call in end.calls]}  # fmt: skip
        if end.text.thinking:
            message["reasoning_content"] = end.text.thinking  # llama-server's, DeepSeek's name
        reason = "tool_calls" if end.calls else finish_reason(end.finish_reason)
        self.end = end
        choice = {"index": self.index, "message": message,
                  "logprobs": openai_choice(self.answer.take_logprobs()),
                  "finish_reason": reason}  # fmt: skip
        return self.response(choice, end)


@api_endpoint(dialect="openai", methods=("POST",), max_body=settings.MAX_IMAGE_BODY_BYTES)
async def chat_completions(request: HttpRequest):
    return await respond(request, parse_body(request, ChatCompletionRequest), ChatWriter)


# --- completions -------------------------------------------------------------------------


class CompletionWriter(OpenAIWriter):
    prefix, object, chunk_object = "cmpl", "text_completion", "text_completion"
    empty = {"text": ""}

    def __init__(self, answer: Answer, body: CompletionRequest, **choice):
        super().__init__(answer, body, **choice)
        self.offsets = CompletionOffsets()  # text_offset counts on over the stream

    def choice(self, text: str) -> dict:
        return {"text": text, "logprobs": self.offsets.shape(self.answer.take_logprobs())}

    def opening(self) -> list[bytes]:
        return []

    def piece(self, piece: Piece) -> list[bytes]:
        return [self.chunk(text=piece.content)] if piece.content else []

    def ending(self, end: Ending) -> list[bytes]:
        return self.closing(end, finish_reason(end.finish_reason))

    def final(self, end: Ending) -> dict:
        self.end = end
        choice = {"index": self.index, **self.choice(end.text.content),
                  "finish_reason": finish_reason(end.finish_reason)}  # fmt: skip
        return self.response(choice, end)


@openai_endpoint
async def completions(request: HttpRequest):
    return await respond(request, parse_body(request, CompletionRequest), CompletionWriter)


# --- embeddings --------------------------------------------------------------------------


@openai_endpoint
async def embeddings(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, OpenAIEmbeddingRequest)
    inputs = body.inputs
    model = await pipeline.resolve_model(body.model)
    check_dimensions(body.dimensions, model.embedding_length)
    # OpenAI refuses an input over the model's limit rather than cutting it.
    result = await embed(model, inputs, truncate=False)
    embedding = result.embedding
    check_dimensions(body.dimensions, embedding.dim)
    if body.encoding_format == "base64":
        vectors = [embedding.base64(i, normalised=True) for i in range(embedding.count)]
    else:
        vectors = embedding.vectors(normalised=True)
    tokens = embedding.prompt_tokens
    return JsonResponse({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": v}
                 for i, v in enumerate(vectors)],
        "model": model.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })  # fmt: skip


__all__ = ["ApiError", "chat_completions", "completions", "embeddings", "list_models",
           "retrieve_model"]  # fmt: skip
