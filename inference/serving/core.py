"""The serving core: one generation from submit to its last event, the same in both modes.

    async for event in serve(host, request, spec): ...

1. Submit the request (a GenerationRequest, as the web side built it) to the host in a thread
   (it may load the model first: seconds to minutes). While a load holds it up, one
   {"type": "phase", "phase": "loading", "request_id", "model"} event says so (so a page can
   show "Loading model… (n s)"). If the listener leaves during the load, the request is
   cancelled as soon as it exists.
2. Forward the request's events as dicts (inference.engine.events), up to done or error.
3. Leaving early (a stop, a disconnect, a full channel) cancels the request at once, so its
   sequence is freed; either way the model's keep-alive clock restarts from the answer's end.

It never raises for a request's own problem: a refusal (bad params, prompt too long, busy, a
load that failed, a runner backing off) is one error event whose `code` is the refusal's kind
(inference.engine.refusals), which the API maps to an HTTP status. The embedded client (the web
process) and the inference worker (split mode) both serve through it.
"""

import asyncio
from collections.abc import AsyncIterator, Callable

from inference.engine import GenerationRequest, RequestHandle, event_to_dict
from inference.engine.host import EngineHost, ModelSpec
from inference.engine.refusals import RefusalKind, Refused

LOADING_POLL_S = 0.25  # a submit that takes longer is checked for a load holding it up


def load_refusal(exc: BaseException) -> Refused:
    """An exception raised while submitting or loading, as a refusal: whatever is not a
    refusal of its own came from loading the model (the GGUF check, the preflight, the runner's
    start)."""
    if not isinstance(exc, Refused):
        return Refused(f"the model could not be loaded: {exc}", kind=RefusalKind.LOAD_FAILED)
    if exc.kind == RefusalKind.NO_MEMORY:  # the numbers: what the load needs, what is free
        return Refused(f"the model does not fit: {exc.message}", kind=exc.kind)
    return exc


def refusal_event(request_id: str, exc: BaseException) -> dict:
    """The error event for an exception raised while submitting (see load_refusal)."""
    return load_refusal(exc).refusal.event(request_id)


def loading_event(request_id: str, model: str) -> dict:
    return {"type": "phase", "phase": "loading", "request_id": request_id, "model": model}


def _cancel_when_submitted(future: asyncio.Future) -> None:
    if not future.cancelled() and future.exception() is None:
        future.result().cancel()


async def serve(
    host: EngineHost,
    request: GenerationRequest,
    spec: ModelSpec,
    *,
    on_handle: Callable[[RequestHandle], None] | None = None,
) -> AsyncIterator[dict]:
    rid = request.request_id
    try:  # 1.
        submitting = asyncio.ensure_future(asyncio.to_thread(host.submit, spec, request))
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
    except Exception as exc:  # noqa: BLE001 - every refusal becomes an error event
        yield refusal_event(rid, exc)
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
