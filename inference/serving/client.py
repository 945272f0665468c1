"""The inference client: how the web process (chat consumer, LAN API) talks to the engine.

Two implementations behind one interface, both on the serving core (inference.serving.core):
- EmbeddedClient: this process supervises the runner processes itself (no REDIS_URL).
- SplitClient (inference.serving.split_client): a Celery task on queue "inference" carries the
  request to an inference worker, which supervises its own runners; events come back over the
  channel layer.

Code outside inference.serving asks the client, never the mode: what it streams, embeds, loads
and unloads, its workers' snapshots and announcements (`announcements`: none embedded), whether
this process must publish those snapshots to the dashboards (`publishes_telemetry`), the idle
unload's sweep (`unload_idle`), and copying a model to another box (`copies`: None where there
is no other box).

`stream()` takes the GenerationRequest the web side built and yields event dicts: {"type":
"phase" | "progress" | "token" | "done" | "error", ...} as inference.engine.events defines them.
It never raises for a request's own problem: a refused request is one error event whose `code`
is a RefusalKind (inference.engine.refusals), which the API maps to an HTTP status. Leaving the
iteration early cancels the generation at once. `set_priority()` changes a running request's
priority ("interactive" or "background", Engine.set_priority) the way `cancel()` reaches it; an
id that is not running (yet, or any more) is ignored.

`embed()` returns the vectors of an EmbedJob (inference.serving.embeds) as an EmbedResult, or
raises EmbedError, whose `event` is the error event a refused generation would give.
`tokenize()` and `detokenize()` (inference.serving.tokens) go through the model's runner the
same way, returning a TokenResult or raising TokenError.
"""

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Literal, Protocol

from django.conf import settings

from inference.engine import GenerationRequest
from inference.engine.generation import Priority
from inference.engine.host import EngineHost, ModelSpec
from inference.engine.media import Image
from inference.serving import kept_prompts
from inference.serving.announcement import WorkerAnnouncement
from inference.serving.copies import ModelCopies
from inference.serving.core import serve
from inference.serving.embeds import EmbedJob, EmbedResult, embed
from inference.serving.feed import worker_snapshot
from inference.serving.hosting import (
    EMBEDDED,
    make_host,
    make_supervisor,
    prompt_cache_config,
    reload_previous,
)
from inference.serving.supervisor import RunnerSupervisor
from inference.serving.tokens import TokenJob, TokenResult, tokens


class InferenceClient(Protocol):
    mode: Literal["embedded", "split"]  # for what the pages and /healthz show, nothing else
    publishes_telemetry: bool  # this process sends its workers' snapshots to the dashboards

    def stream(self, request: GenerationRequest, spec: ModelSpec) -> AsyncIterator[dict]: ...
    async def cancel(self, request_id: str) -> None: ...
    async def set_priority(self, request_id: str, priority: Priority) -> None: ...
    async def embed(self, job: EmbedJob, spec: ModelSpec) -> EmbedResult: ...
    async def tokenize(
        self, spec: ModelSpec, text: str, *, add_special: bool = True,
        parse_special: bool = True,  # false: "<|endoftext|>" is plain text (/infill's code)
        with_pieces: bool = False,
        if_loaded: bool = False,  # only on a loaded model: never load one to count
        images: tuple[Image, ...] = (),  # the text's, one per media marker: read, not encoded
    ) -> TokenResult: ...  # fmt: skip
    async def detokenize(self, spec: ModelSpec, ids: list[int]) -> TokenResult: ...
    async def unload(self, name: str) -> bool: ...
    async def load(self, spec: ModelSpec) -> None: ...
    def unload_idle(self) -> list[str]: ...  # the models whose keep-alive ran out, unloaded
    # Kept prompts (inference.engine.tiers) forgotten on every box: a partition's (a key or a
    # user deleted), or with everything all of a model's (its page's button, its deletion).
    async def forget_prompts(
        self, *, partition: str | None = None, model: ModelSpec | None = None,
        everything: bool = False,
    ) -> int: ...  # fmt: skip
    def reload_previous(self) -> None: ...  # at start: the models loaded before the last stop
    def snapshots(self) -> list[dict]: ...  # one per inference worker
    def announcements(self) -> list[WorkerAnnouncement]: ...  # the live workers; [] embedded
    copies: ModelCopies | None  # copying a model's file to another box; None embedded


class EmbeddedClient:
    """Runner processes supervised by this process: the README's quick start, and the test
    suite's default. The engines live here, so this process publishes their telemetry."""

    mode = "embedded"
    publishes_telemetry = True

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

    async def stream(self, request: GenerationRequest, spec: ModelSpec) -> AsyncIterator[dict]:
        rid = request.request_id

        def remember(handle) -> None:
            self._handles[rid] = handle

        try:
            async for event in serve(self.host, request, spec, on_handle=remember):
                yield event
        finally:
            self._handles.pop(rid, None)

    async def cancel(self, request_id: str) -> None:
        handle = self._handles.get(request_id)
        if handle is not None:
            handle.cancel()

    async def set_priority(self, request_id: str, priority: Priority) -> None:
        handle = self._handles.get(request_id)
        if handle is not None:
            handle.set_priority(priority)

    async def embed(self, job: EmbedJob, spec: ModelSpec) -> EmbedResult:
        return await embed(self.host, job, spec)

    async def tokenize(
        self, spec: ModelSpec, text: str, *, add_special: bool = True, parse_special: bool = True,
        with_pieces: bool = False, if_loaded: bool = False, images: tuple[Image, ...] = (),
    ) -> TokenResult:  # fmt: skip
        job = TokenJob(spec.name, "tokenize", text=text, add_special=add_special,
                       parse_special=parse_special, with_pieces=with_pieces,
                       if_loaded=if_loaded, images=images)  # fmt: skip
        return await tokens(self.host, job, spec)

    async def detokenize(self, spec: ModelSpec, ids: list[int]) -> TokenResult:
        return await tokens(self.host, TokenJob(spec.name, "detokenize", tokens=list(ids)), spec)

    async def unload(self, name: str) -> bool:
        return await asyncio.to_thread(self.host.unload, name)

    async def load(self, spec: ModelSpec) -> None:
        await asyncio.to_thread(self.host.load, spec)

    def unload_idle(self) -> list[str]:
        return self.host.unload_idle()

    async def forget_prompts(
        self, *, partition: str | None = None, model: ModelSpec | None = None,
        everything: bool = False,
    ) -> int:  # fmt: skip
        forgotten = await asyncio.to_thread(
            kept_prompts.forget, self.host, prompt_cache_config(EMBEDDED).directory,
            partition=partition, model=model, everything=everything,
        )  # fmt: skip
        return forgotten.total

    def reload_previous(self) -> None:
        reload_previous(self.host)

    def snapshots(self) -> list[dict]:
        return [worker_snapshot(self.host, "embedded", mode="embedded", supervisor=self.supervisor)]

    copies = None  # one box: nowhere to copy a model to

    def announcements(self) -> list[WorkerAnnouncement]:
        return []  # no inference workers: this process serves


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
