"""The inference client: how the web process (chat consumer, LAN API) talks to the engine.

Two implementations behind one interface:
- EmbeddedClient: the engine runs in this process (no REDIS_URL).
- SplitClient (inference.split_client): a Celery task on queue "inference" carries the request to
  an inference worker; its events come back over the channel layer.

`stream()` yields event dicts: {"type": "phase" | "token" | "done" | "error", ...} as
inference.engine.events defines them. It never raises for a request's own problem: a refused
request (bad params, prompt too long, busy, load failure) is one error event with a `code`
(invalid, too_long, busy, load_failed, unavailable) that the API maps to an HTTP status.
Leaving the iteration early cancels the generation at once.
"""

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from typing import Protocol

from django.conf import settings

from inference.engine import (
    EngineStopped,
    InvalidParams,
    PromptTooLong,
    QueueFull,
    SamplingParams,
    event_to_dict,
)
from inference.engine.host import EngineHost, ModelBusy, ModelSpec
from inference.generation import Generation

log = logging.getLogger(__name__)


def error_event(request_id: str, code: str, message: str) -> dict:
    return {"type": "error", "request_id": request_id, "code": code, "message": message,
            "figures": {}}  # fmt: skip


def refusal(request_id: str, exc: Exception) -> dict:
    """Map an exception raised while submitting to an error event with a code."""
    if isinstance(exc, InvalidParams):
        return error_event(request_id, "invalid", str(exc)) | {"field": exc.field}
    if isinstance(exc, PromptTooLong):
        return error_event(request_id, "too_long", str(exc))
    if isinstance(exc, QueueFull | ModelBusy):
        return error_event(request_id, "busy", str(exc))
    if isinstance(exc, EngineStopped):
        return error_event(request_id, "unavailable", str(exc))
    return error_event(request_id, "load_failed", f"the model could not be loaded: {exc}")


class InferenceClient(Protocol):
    def stream(self, generation: Generation, spec: ModelSpec) -> AsyncIterator[dict]: ...
    async def cancel(self, request_id: str) -> None: ...
    async def unload(self, name: str) -> bool: ...
    async def load(self, spec: ModelSpec) -> None: ...
    def snapshots(self) -> list[dict]: ...  # one per inference worker


def make_host() -> EngineHost:
    from inference.preflight import preflight, validate  # GGUF check; memory vs free

    return EngineHost(
        max_loaded=settings.MAX_LOADED_MODELS,
        itl_target=settings.ITL_TARGET_MS / 1000.0,
        max_queue=settings.ENGINE_MAX_QUEUE,
        validate=validate,
        preflight=preflight,
    )


def _cancel_when_submitted(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().cancel()


class EmbeddedClient:
    """The engine in this process: the README's quick start, and the test suite's default."""

    def __init__(self, host: EngineHost | None = None):
        self.host = host or make_host()
        self.host.start_sweeper()
        self._handles: dict = {}

    async def stream(self, generation: Generation, spec: ModelSpec) -> AsyncIterator[dict]:
        rid = generation.request_id
        try:
            params = SamplingParams(**generation.params)
            submitting = asyncio.ensure_future(asyncio.to_thread(
                self.host.submit, spec, generation.prompt, params,
                keep_alive=generation.keep_alive, accepted_at=generation.accepted_perf(),
                request_id=rid, cache_key=generation.cache_key,
                add_special=generation.add_special,
            ))  # fmt: skip
            try:
                handle = await asyncio.shield(submitting)
            except asyncio.CancelledError:
                # The listener left while the model was loading: the submit still completes
                # in its thread, so cancel the request as soon as it exists.
                submitting.add_done_callback(_cancel_when_submitted)
                raise
        except TypeError as exc:  # an unknown sampling field
            yield error_event(rid, "invalid", str(exc))
            return
        except Exception as exc:  # noqa: BLE001 - every refusal becomes an error event
            yield refusal(rid, exc)
            return
        self._handles[rid] = handle
        try:
            async for event in handle.aevents():
                yield event_to_dict(event)
        finally:
            self._handles.pop(rid, None)
            if handle.final is None:  # the listener left early: free the sequence now
                handle.cancel()
            self.host.touch(spec.name)

    async def cancel(self, request_id: str) -> None:
        handle = self._handles.get(request_id)
        if handle is not None:
            handle.cancel()

    async def unload(self, name: str) -> bool:
        return await asyncio.to_thread(self.host.unload, name)

    async def load(self, spec: ModelSpec) -> None:
        await asyncio.to_thread(self.host.load, spec)

    def snapshots(self) -> list[dict]:
        from inference.feed import worker_snapshot

        return [worker_snapshot(self.host, "embedded", mode="embedded")]


_client: InferenceClient | None = None
_client_lock = threading.Lock()


def get_client() -> InferenceClient:
    """The process-wide client for the configured mode."""
    global _client
    with _client_lock:
        if _client is None:
            if settings.SPLIT_MODE:
                from inference.split_client import SplitClient

                _client = SplitClient()
            else:
                _client = EmbeddedClient()
        return _client


def set_client(client: InferenceClient | None) -> None:
    """Swap the client (tests; shutdown)."""
    global _client
    with _client_lock:
        _client = client
