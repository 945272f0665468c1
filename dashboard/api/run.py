"""One generation through the inference client, from its first event to its stored record: the
running part of an answer (dashboard.api.pipeline starts it and consumes its events).

`start()` waits for the first event, so a refusal (bad parameters, prompt too long, engine busy,
load failure) becomes an HTTP status before any response byte is sent. `events()` yields the
rest. However the run ends (answer done, error, or the HTTP client leaving mid-stream),
`close()` leaves the client's stream, which cancels a generation still running and frees its
sequence, and stores the request's figures (inference.history.record_request: a RequestRecord).
"""

import logging
from collections.abc import AsyncIterator

from asgiref.sync import sync_to_async
from django.conf import settings

from dashboard.api.errors import ApiError, from_event
from dashboard.api.logprobs import LogprobTrail, TokenEntry
from dashboard.limits import api_streams
from dashboard.wire import FirstOutput
from inference.catalog.specs import spec_for
from inference.engine import GenerationRequest
from inference.history import record_answer
from inference.models import LLMModel
from inference.serving.client import get_client

log = logging.getLogger(__name__)


class Run:
    def __init__(
        self,
        model: LLMModel,
        request: GenerationRequest,
        *,
        source: str,
        client_name: str,
        app: str | None = None,
        min_ctx: int = 0,
    ):
        """`min_ctx`: the context per sequence the request needs (Ollama's num_ctx, clamped by
        inference.catalog.specs.context_asked); a model loaded with less is reloaded."""
        self.model = model
        self.request = request
        self.source = source
        self.client_name = client_name
        self._stream = get_client().stream(request, spec_for(model, min_ctx=min_ctx))
        self.first_output = FirstOutput()  # a stream's writer stamps it (dashboard.wire)
        self._first: dict | None = None
        self.final: dict | None = None  # the done or error event
        self.output_tokens = 0
        # The prompt's tokens and, of those, the ones reused from the prefix cache, as the
        # engine says when it admits the request (its first prefill progress), before any token.
        self.prompt_tokens: int | None = None
        self.cached_tokens = 0
        # Its tokens' log-probabilities, for the views to send with the text, when it asked.
        self.logprobs = LogprobTrail() if request.params.logprobs is not None else None
        self._closed = False
        self.app = app  # what MAX_STREAMS_PER_KEY counts: "apikey:<id>"
        self._held_by: str | None = None

    @property
    def id(self) -> str:
        return self.request.request_id

    async def start(self) -> None:
        """Wait for the first event; raises ApiError if the request was refused."""
        app = self.app
        if app is not None:
            if not api_streams.take(app, settings.MAX_STREAMS_PER_KEY):
                self._closed = True  # never started: nothing to cancel or record
                await self._stream.aclose()
                raise ApiError(
                    429, f"this app already has {settings.MAX_STREAMS_PER_KEY} answers running "
                    "(MAX_STREAMS_PER_KEY); wait for one to end", code="too_many_streams",
                    retry_after=1.0,
                )  # fmt: skip
            self._held_by = app
        try:
            event = await anext(self._stream, None)
            # A model load announced before the submit's answer: the answer (a refusal after
            # the load, too) is what decides the HTTP status.
            while event is not None and event["type"] == "phase" and event["phase"] == "loading":
                event = await anext(self._stream, None)
        except BaseException:
            await self.close()
            raise
        if event is None:
            event = {"type": "error", "message": "the inference client ended without an answer"}
        self._see(event)
        if event["type"] == "error":
            await self.close()
            raise from_event(event)
        self._first = event

    async def events(self) -> AsyncIterator[dict]:
        """Every event after start() (its first one included), up to done or error."""
        try:
            if self._first is not None:
                event, self._first = self._first, None
                yield event
            while self.final is None:
                event = await anext(self._stream, None)
                if event is None:
                    event = {"type": "error", "message": "the answer ended without a result"}
                self._see(event)
                yield event
        finally:
            await self.close()

    def _see(self, event: dict) -> None:
        if event["type"] == "progress" and event.get("phase") == "prefilling":
            self.prompt_tokens, self.cached_tokens = event["total"], event["cached"]
        elif event["type"] == "token":
            self.output_tokens += 1
            if self.logprobs is not None:
                self.logprobs.feed(event)
        elif event["type"] in ("done", "error"):
            self.final = event
            if self.logprobs is not None and event["type"] == "done":
                self.logprobs.end(event)

    def take_logprobs(self) -> list[TokenEntry]:
        """The entries of the tokens whose text is out (dashboard.api.logprobs); none when the
        request did not ask."""
        return self.logprobs.take() if self.logprobs is not None else []

    def figures(self, figures: dict) -> dict:
        """The engine's figures for this answer, with its TTFT at the wire when it streamed."""
        return self.first_output.figures(figures, self.request.accepted_perf())

    async def close(self) -> None:
        """Leave the stream (cancelling a generation still running) and store the record."""
        if self._closed:
            return
        self._closed = True
        try:
            await self._stream.aclose()
        finally:
            if self._held_by is not None:
                api_streams.give_back(self._held_by)
            await self._record()

    async def _record(self) -> None:
        final = self.final
        if final is not None:  # its TTFT as the client saw it, when it streamed
            final = {**final, "figures": self.figures(final.get("figures") or {})}
        try:
            await sync_to_async(record_answer)(
                self.request, final, source=self.source, client=self.client_name,
                left="the client disconnected before the answer ended",
                counted={"output_tokens": self.output_tokens},
            )  # fmt: skip
        except Exception:  # noqa: BLE001 - history is best effort; the answer has been given
            log.exception("could not store the figures of request %s", self.id)
