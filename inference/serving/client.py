"""The inference client: how the web process (chat consumer, LAN API) talks to the engine.

Two implementations behind one interface, both on the serving core (inference.serving.core):
- EmbeddedClient: this process supervises the runner processes itself (no REDIS_URL).
- SplitClient (inference.serving.split_client): a Celery task on queue "inference" carries the
  request to an inference worker, which supervises its own runners; events come back over the
  channel layer.

`stream()` yields event dicts: {"type": "phase" | "token" | "done" | "error", ...} as
inference.engine.events defines them. It never raises for a request's own problem: a refused
request (bad params, prompt too long, busy, load failure) is one error event with a `code`
(invalid, too_long, busy, load_failed, unavailable) that the API maps to an HTTP status.
Leaving the iteration early cancels the generation at once.

`embed()` returns the vectors of an EmbedJob (inference.serving.embeds) as an EmbedResult, or
raises EmbedError, whose `event` is the error event a refused generation would give.
"""

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Protocol

from django.conf import settings

from inference.engine.host import EngineHost, ModelSpec
from inference.serving.core import serve
from inference.serving.embeds import EmbedJob, EmbedResult, embed
from inference.serving.feed import worker_snapshot
from inference.serving.generation import Generation
from inference.serving.supervisor import RunnerSupervisor


class InferenceClient(Protocol):
    def stream(self, generation: Generation, spec: ModelSpec) -> AsyncIterator[dict]: ...
    async def cancel(self, request_id: str) -> None: ...
    async def embed(self, job: EmbedJob, spec: ModelSpec) -> EmbedResult: ...
    async def unload(self, name: str) -> bool: ...
    async def load(self, spec: ModelSpec) -> None: ...
    def snapshots(self) -> list[dict]: ...  # one per inference worker


def make_supervisor() -> RunnerSupervisor:
    return RunnerSupervisor(
        itl_target=settings.ITL_TARGET_MS / 1000.0,
        max_queue=settings.ENGINE_MAX_QUEUE,
        state_dir=settings.DATA_DIR,
    )


def make_host(supervisor: RunnerSupervisor) -> EngineHost:
    """The serving host: every loaded model in a runner process of `supervisor`."""
    from inference.preflight import fit, validate  # GGUF check; context sized, memory vs free

    def fits_beside_the_loaded(spec: ModelSpec, replacing: ModelSpec | None = None) -> ModelSpec:
        # Runs under the host's load lock, after room was made: what is loaded now stays.
        others = [row for row in host.loaded() if row["name"] != spec.name]
        return fit(spec, resident_bytes=sum(row["size_bytes"] for row in others),
                   replacing=replacing)  # fmt: skip

    host = EngineHost(
        engine_factory=supervisor.start,
        max_loaded=settings.MAX_LOADED_MODELS,
        itl_target=settings.ITL_TARGET_MS / 1000.0,
        max_queue=settings.ENGINE_MAX_QUEUE,
        validate=validate,
        preflight=fits_beside_the_loaded,
    )
    return host


class EmbeddedClient:
    """Runner processes supervised by this process: the README's quick start, and the test
    suite's default."""

    def __init__(self, host: EngineHost | None = None, supervisor: RunnerSupervisor | None = None):
        """Without a host: runner processes of a new supervisor. With one (tests): its engines,
        and `supervisor` only for the runner states in snapshots."""
        if host is None:
            supervisor = supervisor or make_supervisor()
            host = make_host(supervisor)
        self.host = host
        self.supervisor = supervisor
        self.host.start_sweeper()
        self._handles: dict = {}

    async def stream(self, generation: Generation, spec: ModelSpec) -> AsyncIterator[dict]:
        rid = generation.request_id

        def remember(handle) -> None:
            self._handles[rid] = handle

        try:
            async for event in serve(self.host, generation, spec, on_handle=remember):
                yield event
        finally:
            self._handles.pop(rid, None)

    async def cancel(self, request_id: str) -> None:
        handle = self._handles.get(request_id)
        if handle is not None:
            handle.cancel()

    async def embed(self, job: EmbedJob, spec: ModelSpec) -> EmbedResult:
        return await embed(self.host, job, spec)

    async def unload(self, name: str) -> bool:
        return await asyncio.to_thread(self.host.unload, name)

    async def load(self, spec: ModelSpec) -> None:
        await asyncio.to_thread(self.host.load, spec)

    def snapshots(self) -> list[dict]:
        return [worker_snapshot(self.host, "embedded", mode="embedded", supervisor=self.supervisor)]


_client: InferenceClient | None = None
_client_lock = threading.Lock()


def get_client() -> InferenceClient:
    """The process-wide client for the configured mode."""
    global _client
    with _client_lock:
        if _client is None:
            if settings.SPLIT_MODE:
                from inference.serving.split_client import SplitClient

                _client = SplitClient()
            else:
                _client = EmbeddedClient()
        return _client


def set_client(client: InferenceClient | None) -> None:
    """Swap the client (tests; shutdown)."""
    global _client
    with _client_lock:
        _client = client
