"""llama-server's /infill: code completion for editors (llama.vscode, llama.vim, Qt Creator).

The body is llama-server's: `input_prefix` and `input_suffix` (the code around the cursor),
`prompt` (the current line's start), `input_extra` (other files' chunks, {filename, text}) and
its sampling and stopping fields (dashboard.api.llama_server.sampling). The prompt is laid out
as llama-server lays it out (inference.text.infill, through dashboard.api.fim), so the same
request reads the same tokens; it runs on the one answer pipeline (dashboard.api.pipeline) as
interactive work unless its key is held lower, so it never waits behind a background flood, and
its prefix is reused from the prompt cache when an earlier request in the same partition read
the same tokens.

Reading the answer, the route applies what only it can:
1. n_predict 0 (an editor's warm-up): the prompt is read into the cache; no text is answered;
2. t_max_prompt_ms: no first token by then ends the request with no text;
3. n_indent and t_max_predict_ms (dashboard.api.llama_server.limits);
4. however it ends (a limit, the client leaving), the run is closed, which cancels the
   generation and frees its sequence within one engine step.

The answer is llama-server's: one object (stream: false) or SSE chunks ending with it, with its
`timings`, `stop_type` and `tokens_evaluated`, and only the `response_fields` asked, when asked.
"""

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Annotated

from django.http import HttpRequest, HttpResponse, JsonResponse
from pydantic import Field, model_validator

from dashboard.api import pipeline
from dashboard.api.auth import api_endpoint
from dashboard.api.bodies import MAX_PROMPT_CHARS, PromptText, Strict, parse_body
from dashboard.api.errors import ApiError, from_event
from dashboard.api.figures import timings
from dashboard.api.llama_server.limits import Stopping
from dashboard.api.llama_server.sampling import Limits, LlamaSampling
from dashboard.api.streaming import sse, stream_response
from inference.text.infill import DEFAULT_FILENAME, ExtraChunk, InfillText

post = api_endpoint(dialect="openai", methods=("POST",))

MAX_EXTRA_CHUNKS = 256  # llama.vscode keeps 16 by default (ring_n_chunks), llama.vim 64


class ExtraChunkBody(Strict):
    text: PromptText
    filename: Annotated[str, Field(max_length=1024)] = DEFAULT_FILENAME


class InfillRequest(LlamaSampling):
    input_prefix: PromptText
    input_suffix: PromptText
    input_extra: Annotated[list[ExtraChunkBody], Field(max_length=MAX_EXTRA_CHUNKS)] = []
    prompt: PromptText = ""

    @model_validator(mode="after")
    def _bounded(self) -> "InfillRequest":
        chars = len(self.input_prefix) + len(self.input_suffix) + len(self.prompt) + sum(
            len(chunk.text) + len(chunk.filename) for chunk in self.input_extra)  # fmt: skip
        if chars > MAX_PROMPT_CHARS:
            raise ValueError(f"the texts are {chars} characters together, over "
                             f"{MAX_PROMPT_CHARS}")  # fmt: skip
        return self

    def ask(self) -> pipeline.Ask:
        extra = tuple(ExtraChunk(chunk.text, chunk.filename) for chunk in self.input_extra)
        text = InfillText(self.input_prefix, self.input_suffix, self.prompt, extra)
        return pipeline.Ask(model=self.model, infill=text, sampling=self.sampling())


@post
async def infill(request: HttpRequest) -> HttpResponse:
    body = parse_body(request, InfillRequest)
    model = await pipeline.resolve_model(body.model)
    if not model.fills_in_middle:
        missing = " ".join(f"{name} token is missing." for role, name in
                           (("pre", "prefix"), ("suf", "suffix"), ("mid", "middle"))
                           if role not in model.fim_tokens)  # fmt: skip
        raise ApiError(400, f"Infill is not supported by this model: {missing} (\"{model.name}\" "
                       "has no fill-in-the-middle tokens)", param="model",
                       code="insert_not_supported")  # fmt: skip
    answer = await pipeline.start(request, body.ask(), source="llama-server", model=model)
    reading = Reading(answer, body.limits(), body.response_fields)
    if body.stream:
        return stream_response(reading.chunks(), "text/event-stream")
    async for _ in reading.pieces():
        pass
    return JsonResponse(reading.final())


class Reading:
    """One /infill answer as it is read (the module's steps 1 to 4)."""

    def __init__(self, answer: pipeline.Answer, limits: Limits, fields: list[str] | None):
        self.answer = answer
        self.limits = limits
        self.fields = fields
        self.stopping = Stopping(limits)
        self.prompt_n = len(answer.run.request.prompt)
        self.cached = 0
        self.predicted = 0
        self.done: dict | None = None
        self.started = time.perf_counter()
        self.first_at: float | None = None
        self.ended_at: float | None = None

    async def pieces(self) -> AsyncIterator[str]:
        """The answer's text as it comes (none for a warm-up); ends at its end or a limit."""
        run = self.answer.run
        events = run.events()
        try:
            while True:
                try:
                    event = await self._next(events)
                except TimeoutError:
                    break  # step 2: the prompt took too long; nothing is answered
                if event is None:
                    break
                if event["type"] == "progress" and event.get("phase") == "prefilling":
                    self.cached = event.get("cached") or 0
                elif event["type"] == "token":
                    self.predicted += 1
                    self.first_at = self.first_at or time.perf_counter()
                    if self.limits.warm_up:
                        break  # step 1: the prompt is in the cache; its one token is dropped
                    piece = self.stopping.feed(event["text"], time.perf_counter())
                    if piece:
                        yield piece
                    if self.stopping.stopped:
                        break  # step 3
                elif event["type"] == "done":
                    self.done = event
                    break
                elif event["type"] == "error":
                    raise from_event(event)
        finally:
            self.ended_at = time.perf_counter()
            await run.close()  # step 4

    async def _next(self, events: AsyncIterator[dict]) -> dict | None:
        wait = self.limits.prompt_s if self.first_at is None else None
        if wait is None:
            return await anext(events, None)
        left = max(0.0, self.started + wait - time.perf_counter())
        return await asyncio.wait_for(anext(events, None), left)

    async def chunks(self) -> AsyncIterator[bytes]:
        """SSE: each piece as llama-server streams it, then the final object."""
        async for piece in self.pieces():
            yield sse({"index": 0, "content": piece, "tokens": [], "stop": False,
                       "id_slot": -1, "tokens_predicted": self.predicted,
                       "tokens_evaluated": self.prompt_n})  # fmt: skip
        yield sse(self.final())

    def final(self) -> dict:
        whole = {
            "index": 0,
            "content": "" if self.limits.warm_up else self.stopping.text,
            "tokens": [],
            "id_slot": -1,
            "stop": True,
            "model": self.answer.name,
            "tokens_predicted": 0 if self.limits.warm_up else self.predicted,
            "tokens_evaluated": self.prompt_n,
            "has_new_line": self.stopping.has_new_line,
            "truncated": False,
            **self._stop(),
            "tokens_cached": self.prompt_n + self.predicted,
            "timings": self._timings(),
        }
        return whole if self.fields is None else pick(whole, self.fields)

    def _stop(self) -> dict:
        done = self.done
        if done is None:  # a limit (or the warm-up) ended it
            return {"stop_type": "limit", "stopping_word": ""}
        if done.get("stop"):
            return {"stop_type": "word", "stopping_word": done["stop"]}
        kind = "limit" if done.get("finish_reason") == "length" else "eos"
        return {"stop_type": kind, "stopping_word": ""}

    def _timings(self) -> dict:
        """The engine's figures when the answer ran to its end; else what this route saw."""
        if self.done is not None:
            figures = timings(self.answer.run.figures(self.done.get("figures") or {}))
        else:
            first, end = self.first_at or self.ended_at, self.ended_at
            predicted = 0 if self.limits.warm_up else self.predicted
            figures = {"prompt_n": max(0, self.prompt_n - self.cached),
                       "prompt_ms": (first - self.started) * 1000, "cache_n": self.cached,
                       "predicted_n": predicted, "predicted_ms": (end - first) * 1000}  # fmt: skip
            figures["predicted_per_second"] = (
                predicted / (figures["predicted_ms"] / 1000) if predicted and end > first else None
            )
        return {**figures, **_per_token(figures)}


def _per_token(figures: dict) -> dict:
    def ratio(ms: float | None, n: int | None) -> float | None:
        return ms / n if ms is not None and n else None

    return {"prompt_per_token_ms": ratio(figures.get("prompt_ms"), figures.get("prompt_n")),
            "predicted_per_token_ms": ratio(figures.get("predicted_ms"),
                                            figures.get("predicted_n"))}  # fmt: skip


def pick(whole: dict, fields: list[str]) -> dict:
    """llama-server's response_fields: only the fields named, a nested one ("timings/prompt_n")
    under its whole path; a name that is not there is left out."""
    picked = {}
    for name in fields:
        value, found = whole, True
        for part in name.split("/"):
            if isinstance(value, dict) and part in value:
                value = value[part]
            else:
                found = False
                break
        if found:
            picked[name] = value
    return picked
