"""The serving core: one generation from submit to its last event, the same in both modes.

    async for event in serve(host, generation, spec): ...

1. Submit to the host in a thread (it may load the model first: seconds to minutes). While a
   load holds it up, one {"type": "phase", "phase": "loading", "request_id", "model"} event
   says so (so a page can show "Loading model… (n s)"). If the listener leaves during the
   load, the request is cancelled as soon as it exists.
2. Forward the request's events as dicts (inference.engine.events), up to done or error.
3. Leaving early (a stop, a disconnect, a full channel) cancels the request at once, so its
   sequence is freed; either way the model's keep-alive clock restarts from the answer's end.

It never raises for a request's own problem: a refusal (bad params, prompt too long, busy, a
load that failed, a runner backing off) is one error event with a `code` that the API maps to
an HTTP status. The embedded client (the web process) and the inference worker (split mode)
both serve through it.
"""

import asyncio
from collections.abc import AsyncIterator, Callable

from inference.engine import (
    EngineStopped,
    InvalidParams,
    PromptTooLong,
    QueueFull,
    RequestHandle,
    SamplingParams,
    event_to_dict,
)
from inference.engine.host import EngineHost, ModelBusy, ModelSpec
from inference.memory import InsufficientMemory
from inference.serving.generation import Generation
from inference.serving.supervisor import RunnerBackoff

LOADING_POLL_S = 0.25  # a submit that takes longer is checked for a load holding it up


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
    if isinstance(exc, EngineStopped | RunnerBackoff):
        return error_event(request_id, "unavailable", str(exc))
    if isinstance(exc, InsufficientMemory):  # the numbers: what the load needs, what is free
        return error_event(request_id, "no_memory", f"the model does not fit: {exc}")
    return error_event(request_id, "load_failed", f"the model could not be loaded: {exc}")


def loading_event(request_id: str, model: str) -> dict:
    return {"type": "phase", "phase": "loading", "request_id": request_id, "model": model}


def _cancel_when_submitted(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().cancel()


async def serve(
    host: EngineHost,
    generation: Generation,
    spec: ModelSpec,
    *,
    on_handle: Callable[[RequestHandle], None] | None = None,
) -> AsyncIterator[dict]:
    rid = generation.request_id
    try:  # 1.
        params = SamplingParams(**generation.params)
        submitting = asyncio.ensure_future(asyncio.to_thread(
            host.submit, spec, generation.prompt, params,
            keep_alive=generation.keep_alive, accepted_at=generation.accepted_perf(),
            request_id=rid, cache_key=generation.cache_key,
            cache_partition=generation.cache_partition, add_special=generation.add_special,
        ))  # fmt: skip
        announced = False
        try:
            # asyncio.wait leaves `submitting` running when this task is cancelled.
            while not (await asyncio.wait({submitting}, timeout=LOADING_POLL_S))[0]:
                loading = host.loading  # this model, or one loading ahead of it
                if not announced and loading is not None:
                    announced = True
                    yield loading_event(rid, loading)
            handle = submitting.result()
        except (asyncio.CancelledError, GeneratorExit):
            submitting.add_done_callback(_cancel_when_submitted)
            raise
    except TypeError as exc:  # an unknown sampling field
        yield error_event(rid, "invalid", str(exc))
        return
    except Exception as exc:  # noqa: BLE001 - every refusal becomes an error event
        yield refusal(rid, exc)
        return
    if on_handle is not None:
        on_handle(handle)
    try:  # 2.
        async for event in handle.aevents():
            yield event_to_dict(event)
    finally:  # 3.
        if handle.final is None:
            handle.cancel()
        host.touch(spec.name)
