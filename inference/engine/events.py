"""What leaves the engine: events, delivered to the submitter through a handle.

As dicts (event_to_dict), the progress events are a contract with the pages that show them:
    {"type": "progress", "request_id", "phase": "waiting", "ahead": N}
    {"type": "progress", "request_id", "phase": "prefilling", "done", "total", "cached"}
    {"type": "progress", "request_id", "phase": "paused"}
Consumers ignore event types they do not know. "paused" is sent once when a running background
request's tokens stop because interactive work came first; its next token or prefill progress
says that it runs again.

The engine thread only ever calls `RequestHandle.deliver`; a consumer reads with `events()` from
a thread or `aevents()` from an asyncio loop. Both end after the request's last event (done or
error).
"""

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Literal

from inference.engine.refusals import RefusalKind


@dataclass(slots=True, frozen=True)
class TokenLogprob:
    """One token of the vocabulary at one step, and its log-probability there."""

    token_id: int
    piece: bytes  # its bytes (a special token written out); a part of a character, for some
    logprob: float


@dataclass(slots=True, frozen=True)
class StepLogprobs:
    """A sampled token's log-probability, and the likeliest tokens at its step (as many as the
    request's `logprobs` asked, the likeliest first). From the step's logits at the request's
    temperature, over the whole vocabulary (inference.engine.runner, `logprobs`)."""

    chosen: TokenLogprob
    top: tuple[TokenLogprob, ...] = ()


@dataclass(slots=True, frozen=True)
class TokenEvent:
    request_id: str
    text: str  # may be "" while bytes of a character or a possible stop string are held back
    token_id: int
    index: int
    type: Literal["token"] = "token"
    logprobs: StepLogprobs | None = None  # only when the request's params ask for them


@dataclass(slots=True, frozen=True)
class PhaseEvent:
    request_id: str
    phase: Literal["encoding", "waiting", "prefilling", "decoding"]  # encoding: its images
    type: Literal["phase"] = "phase"


@dataclass(slots=True, frozen=True)
class QueueEvent:
    """A waiting request's place in the queue, sent when it changes (not on every step)."""

    request_id: str
    ahead: int  # requests queued before this one; 0: next to be admitted
    phase: Literal["waiting"] = "waiting"
    type: Literal["progress"] = "progress"


@dataclass(slots=True, frozen=True)
class PrefillEvent:
    """How far the prompt is read, after each prompt chunk: one event per chunk, not per token."""

    request_id: str
    done: int  # prompt tokens in the KV now, the cached ones included
    total: int  # prompt tokens
    cached: int  # of those, reused from the prefix cache (never computed)
    phase: Literal["prefilling"] = "prefilling"
    type: Literal["progress"] = "progress"


@dataclass(slots=True, frozen=True)
class PausedEvent:
    """A running request set aside for interactive work: its KV stays, it resumes where it was."""

    request_id: str
    phase: Literal["paused"] = "paused"
    type: Literal["progress"] = "progress"


@dataclass(slots=True, frozen=True)
class DoneEvent:
    request_id: str
    finish_reason: Literal["stop", "length", "cancelled"]
    text: str
    figures: dict
    type: Literal["done"] = "done"
    stop: str | None = None  # the stop string that ended the answer (Anthropic's stop_sequence)


@dataclass(slots=True, frozen=True)
class ErrorEvent:
    request_id: str
    message: str
    figures: dict
    type: Literal["error"] = "error"
    # "unavailable": the runner process ended; "failed": the request broke in the engine
    code: RefusalKind = RefusalKind.FAILED


Event = TokenEvent | PhaseEvent | QueueEvent | PrefillEvent | PausedEvent | DoneEvent | ErrorEvent


def event_to_dict(event: Event) -> dict:
    data = asdict(event)
    if "code" in data:  # a plain string on the wire (JSON, msgpack), whatever reads it
        data["code"] = str(data["code"])
    return data


def is_final(event: Event) -> bool:
    return event.type in ("done", "error")


class RequestHandle:
    """The submitter's side of one request: its events, and ways to cancel it and to change
    its priority while it runs (each a message to whoever holds the request)."""

    def __init__(
        self,
        request_id: str,
        cancel: Callable[[str], None],
        sink: Callable[[Event], None] | None = None,
        *,
        set_priority: Callable[[str, str], None] | None = None,
    ):
        self.id = request_id
        self._cancel = cancel
        self._set_priority = set_priority
        # With a sink, events go straight to it (a runner process forwards them over its
        # connection) instead of waiting in this handle for a reader.
        self._sink = sink
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[Event] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._async_queue: asyncio.Queue[Event] | None = None
        self.final: Event | None = None

    def deliver(self, event: Event) -> None:
        """Called by the engine thread for every event of this request."""
        if self._sink is not None:  # fixed at construction: no reader to hand over to
            if is_final(event):
                self.final = event
            self._sink(event)
            return
        with self._lock:
            if is_final(event):
                self.final = event
            if self._loop is None:
                self._queue.put(event)
                return
            loop, target = self._loop, self._async_queue
        try:
            loop.call_soon_threadsafe(target.put_nowait, event)
        except RuntimeError:
            pass  # the consumer's loop has closed: nobody is listening any more

    def cancel(self) -> None:
        self._cancel(self.id)

    def set_priority(self, priority: str) -> None:
        """"interactive" or "background" from the engine's next step on (Engine.set_priority);
        a handle made without the callback has no engine that could change it: a no-op."""
        if self._set_priority is not None:
            self._set_priority(self.id, priority)

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Blocking iterator for threads; raises queue.Empty if `timeout` passes between events."""
        while True:
            event = self._queue.get(timeout=timeout)
            yield event
            if is_final(event):
                return

    async def aevents(self) -> AsyncIterator[Event]:
        """Async iterator; binds this handle to the running loop on first use."""
        with self._lock:
            if self._loop is None:
                self._loop = asyncio.get_running_loop()
                self._async_queue = asyncio.Queue()
                while True:  # move anything delivered before binding
                    try:
                        self._async_queue.put_nowait(self._queue.get_nowait())
                    except queue.Empty:
                        break
            target = self._async_queue
        while True:
            event = await target.get()
            yield event
            if is_final(event):
                return

    def result(self, timeout: float | None = None) -> Event:
        """Wait for the final event (done or error), dropping the stream."""
        final = None
        for final in self.events(timeout=timeout):  # noqa: B007 - the last event is the result
            pass
        return final
