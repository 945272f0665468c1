"""llama-server's answer to /completion and /infill (one task type there, one writer here): the
final object with its generation_settings and timings, and its SSE stream, read off the run as
it comes so that the route can apply what only it can (tools/server/server-context.cpp):

1. n_predict 0 (an editor's warm-up): the prompt is read into the cache; no text is answered;
2. t_max_prompt_ms: no first token by then ends the request with no text;
3. n_indent and t_max_predict_ms (dashboard.api.llama_server.limits);
4. however it ends (a limit, the client leaving), the run is closed, which cancels the
   generation and frees its sequence within one engine step.

Streamed (`stream: true`), each piece of text is a `data: {...}` line with `stop: false`, and the
last line is the final object with `stop: true` and empty content; no [DONE] follows, as in
llama-server. Not streamed, the answer is that final object with the whole content. Either way
`response_fields`, when asked, keeps only the fields it names in the final object.
"""

import asyncio
import time
from collections.abc import AsyncIterator

from django.http import HttpResponse, JsonResponse

from dashboard.api import pipeline
from dashboard.api.errors import ApiError, from_event
from dashboard.api.figures import timings
from dashboard.api.llama_server.limits import Stopping
from dashboard.api.llama_server.sampling import LlamaSampling, settings_json
from dashboard.api.streaming import sse, stream_response


def stop_type(done: dict) -> str:
    """llama-server's stop_type for the engine's done event: eos, word (a stop string), limit
    (n_predict), none."""
    if done.get("finish_reason") == "length":
        return "limit"
    if done.get("finish_reason") == "stop":
        return "word" if done.get("stop") else "eos"
    return "none"


def server_timings(figures: dict) -> dict:
    """llama-server's timings object (the appliance's other figures beside it)."""
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


class Reading:
    """One answer as it is read (the module's steps 1 to 4), and its llama-server shapes.
    `prompt`: what the final object shows as its prompt."""

    def __init__(self, answer: pipeline.Answer, body: LlamaSampling, prompt: str = ""):
        self.answer = answer
        self.body = body
        self.prompt = prompt
        self.limits = body.limits()
        self.stopping = Stopping(self.limits)
        self.predicted = 0
        self.done: dict | None = None
        self.started = time.perf_counter()
        self.first_at: float | None = None
        self.ended_at: float | None = None

    async def respond(self) -> HttpResponse:
        """The SSE stream (stream: true), or the final object once the answer has ended (an
        error raises)."""
        if self.body.stream:
            return stream_response(self.chunks(), "text/event-stream")
        async for _ in self.pieces():
            pass
        return JsonResponse(self.final(streamed=False))

    @property
    def prompt_n(self) -> int:
        """The prompt's tokens, as the engine counted them (or the ids sent, before it did)."""
        run = self.answer.run
        if run.prompt_tokens is not None:
            return run.prompt_tokens
        prompt = run.request.prompt
        return 0 if isinstance(prompt, str) else len(prompt)

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
                if event["type"] == "token":
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
        """SSE: each piece as llama-server streams it, then the final object; an error after
        the stream began is its last line."""
        try:
            async for piece in self.pieces():
                yield sse({"index": 0, "content": piece, "tokens": [], "stop": False,
                           "id_slot": 0, "tokens_predicted": self.predicted,
                           "tokens_evaluated": self.prompt_n})  # fmt: skip
                # On the socket now (Django's ASGI handler resumes this generator once the
                # server has written the chunk): its first output is the TTFT.
                self.answer.run.first_output.sent()
        except ApiError as error:
            yield sse(error.body("openai"))
            return
        yield sse(self.final(streamed=True))

    def final(self, *, streamed: bool) -> dict:
        """llama-server's final object (server_task_result_cmpl_final::to_json_non_oaicompat):
        streamed, its content is in the pieces before it."""
        stop = self._stop()
        content = "" if streamed or self.limits.warm_up else self.stopping.text
        figures = self._timings()
        settings = {**settings_json(self.answer.run.request.params), "stream": streamed}
        if self.limits.warm_up:
            settings["n_predict"] = settings["max_tokens"] = 0  # as asked (the engine ran one)
        whole = {
            "index": 0,
            "content": content,
            "tokens": [],
            "id_slot": 0,
            "stop": True,
            "model": self.answer.name,
            "tokens_predicted": self._predicted(stop["stop_type"]),
            "tokens_evaluated": self.prompt_n,
            "generation_settings": settings,
            "prompt": self.prompt,
            "has_new_line": self.stopping.has_new_line,
            "truncated": False,
            **stop,
            # What the sequence holds now: the prompt and the tokens decoded after it.
            "tokens_cached": self.prompt_n + figures["predicted_n"],
            "timings": figures,
        }
        fields = self.body.response_fields
        return whole if fields is None else pick(whole, fields)

    def _predicted(self, kind: str) -> int:
        """llama-server's tokens_predicted: it counts the end-of-generation token it sampled;
        the engine samples it too but does not output it (bench/completion.py compares)."""
        if self.limits.warm_up:
            return 0
        if self.done is None:
            return self.predicted
        return ((self.done.get("figures") or {}).get("output_tokens") or 0) + (kind == "eos")

    def _stop(self) -> dict:
        if self.done is None or self.limits.warm_up:  # a limit (or the warm-up) ended it
            return {"stop_type": "limit", "stopping_word": ""}
        return {"stop_type": stop_type(self.done), "stopping_word": self.done.get("stop") or ""}

    def _timings(self) -> dict:
        """The engine's figures when the answer ran to its end; else what this route saw."""
        if self.done is not None:
            return server_timings(timings(self.answer.run.figures(self.done.get("figures") or {})))
        first, end = self.first_at or self.ended_at, self.ended_at
        predicted = 0 if self.limits.warm_up else self.predicted
        cached = self.answer.run.cached_tokens
        figures = {"prompt_n": max(0, self.prompt_n - cached),
                   "prompt_ms": (first - self.started) * 1000, "cache_n": cached,
                   "predicted_n": predicted, "predicted_ms": (end - first) * 1000}  # fmt: skip
        figures["predicted_per_second"] = (
            predicted / (figures["predicted_ms"] / 1000) if predicted and end > first else None
        )
        return server_timings(figures)
