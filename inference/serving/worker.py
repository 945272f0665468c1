"""The inference worker: a Celery worker on queue "inference" that supervises the runner
processes (split mode).

    celery -A appliance worker -Q inference -P threads -c 16 -n inference@%h

It also consumes a queue of its own, "inference.<worker name>" (split_protocol.worker_queue),
added at start: the split client's router (inference.serving.routing) sends a request there to
choose its worker, from what each worker announces (worker_state).

One process, one EngineHost (inference.serving.client.make_host) whose models each run in a
runner process of this worker, exactly as in embedded mode. The threads pool lets many
"inference.generate" tasks run at once: each one serves its request through the serving core
(inference.serving.core) and forwards the events to the web process's reply channel, while each
runner's engine batches them all together. The worker never touches the database: the task
payload carries the model's spec, so a second box needs only Redis and the model files.

A task, step by step:
1. Skip a request nobody waits for any more (the client gave up or cancelled while it queued),
   and refuse to run again a request whose first token already went out (a redelivery after
   its worker died: the client has reported that failure, and answering twice would be wrong).
2. Claim it (appliance:req:<id>:claimed, SET NX): a copy the client routed again after the
   worker it chose vanished is dropped by whichever worker comes second. Remember this worker
   as the conversation's (its cache key), then send {"type": "claimed", "worker", "instance"}
   so the client knows whose heartbeat to watch.
3. Serve it through the serving core (loading the model if needed, from this box's own copy of
   the file: WorkerRuntime.local_spec) and forward every event; the first token sets
   appliance:req:<id>:started.
4. Mark the request closed so that a late redelivery of this task does nothing.

"inference.embed" (embeddings, inference.serving.embeds) and "inference.tokenize" (tokens,
inference.serving.tokens) are claimed the same way and answered with one message; they keep no
marks, as computing the same answer twice harms nobody.

"inference.copy_model" (inference.serving.copy_worker) comes only on this worker's own queue:
it fetches a model's file from the web box into this box's MODELS_DIR.
"""

import asyncio
import logging
import socket
import threading

from celery import shared_task
from celery.signals import celeryd_after_setup, worker_shutdown
from channels.exceptions import ChannelFull
from channels.layers import get_channel_layer
from django.conf import settings

from inference.engine import GenerationRequest
from inference.engine.host import ModelSpec
from inference.engine.refusals import RefusalKind, Refused, error_event
from inference.serving import copy_worker
from inference.serving.copies import COPY_TASK, CopyJob
from inference.serving.core import serve as serve_generation
from inference.serving.embeds import EmbedError, EmbedJob
from inference.serving.embeds import embed as serve_embed
from inference.serving.split_protocol import QUEUE, cancelled_event, claimed_event, worker_queue
from inference.serving.tokens import TokenError, TokenJob
from inference.serving.tokens import tokens as serve_tokens
from inference.serving.worker_state import WorkerRuntime

log = logging.getLogger(__name__)

# Kept under the broker's visibility timeout (1 h): a task still running past it would be
# redelivered to another worker while this one answers. max_tokens and the context bound every
# answer long before this; it only stops an answer nobody reads that cannot end by itself.
GENERATE_TIME_LIMIT_S = 50 * 60
THREAD_POOLS = ("celery.concurrency.thread", "celery.concurrency.solo")

_runtime: WorkerRuntime | None = None
_runtime_lock = threading.Lock()
_node_name: str | None = None


def runtime() -> WorkerRuntime:
    """This process's worker state, started on first use."""
    global _runtime
    with _runtime_lock:
        if _runtime is None:
            name = settings.WORKER_NAME or _node_name or f"inference@{socket.gethostname()}"
            _runtime = WorkerRuntime(name, settings.REDIS_URL).start()
        return _runtime


@celeryd_after_setup.connect
def _start_inference_worker(sender: str, instance, **kwargs) -> None:
    """Start the engine host and heartbeats before the first task arrives, but only in a worker
    that consumes queue "inference" (the jobs worker imports this module too)."""
    global _node_name
    if QUEUE not in instance.app.amqp.queues.consume_from:
        return
    pool = getattr(instance.pool_cls, "__module__", str(instance.pool_cls))
    problem = ""
    if pool not in THREAD_POOLS:  # with prefork each child would load its own copy of a model
        problem = f"the inference worker needs the threads pool (-P threads), not {pool}"
    elif not settings.REDIS_URL:
        problem = "the inference worker needs REDIS_URL (split mode)"
    if problem:
        log.critical(problem)
        raise SystemExit(problem)  # Celery logs and swallows other exceptions from signals
    _node_name = sender
    # Its own queue besides the shared one, named after the worker: the router's choice.
    instance.app.amqp.queues.select_add(worker_queue(runtime().name))


@worker_shutdown.connect
def _stop_inference_worker(**kwargs) -> None:
    global _runtime
    with _runtime_lock:
        current, _runtime = _runtime, None
    if current is not None:
        current.stop()


@shared_task(
    name="inference.generate",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    soft_time_limit=GENERATE_TIME_LIMIT_S,  # enforced by serve(): the threads pool has no timers
    time_limit=GENERATE_TIME_LIMIT_S + 60,
)
def generate(payload: dict) -> None:
    """Answer one request: payload = {"request": GenerationRequest.to_wire(), "spec":
    ModelSpec.to_wire(), "reply": channel name}."""
    serve(runtime(), payload)


@shared_task(
    name="inference.embed",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    time_limit=GENERATE_TIME_LIMIT_S,
)
def embed(payload: dict) -> None:
    """Embed one request's inputs: payload = {"job": EmbedJob.to_dict(), "spec":
    ModelSpec.to_wire(), "reply": channel name}. Claimed like a generation, then one "done"
    message with the vectors (EmbedResult.to_dict()) or an error event. Computing them twice
    after a redelivery is harmless, so no marks are kept."""
    reply = _reply_channel(payload, "embed")
    if reply is None:
        return
    asyncio.run(_answer_once(runtime(), payload, reply, job_type=EmbedJob, compute=serve_embed,
                             field="embedding", refused=EmbedError))  # fmt: skip


async def _answer_once(
    rt: WorkerRuntime, payload: dict, reply: str, *, job_type, compute, field: str, refused
) -> None:
    """A task answered by one message (embeddings, tokens): claimed like a generation, then
    {"type": "done", "request_id", <field>: the result's to_dict()} or an error event;
    `refused` is the exception type whose `event` is the error event of a refusal."""
    layer = get_channel_layer()
    raw = payload.get("job")
    rid = str(raw.get("request_id", "")) if isinstance(raw, dict) else ""
    try:
        job = job_type(**raw)
        spec = ModelSpec.from_wire(payload["spec"])
    except (KeyError, TypeError, ValueError) as exc:
        await layer.send(reply, error_event(rid, RefusalKind.INVALID, f"malformed request: {exc}"))
        return
    await layer.send(reply, claimed_event(rid, rt.name, rt.instance))
    try:
        spec = await asyncio.to_thread(rt.local_spec, spec)
        result = await compute(rt.host, job, spec)
        answer = {"type": "done", "request_id": rid, field: result.to_dict()}
    except refused as exc:
        answer = exc.event
    except Refused as exc:  # no copy of the model on this box
        answer = exc.refusal.event(rid)
    except Exception as exc:  # noqa: BLE001 - whatever broke, the client hears about it
        log.exception("%s failed", rid)
        answer = error_event(rid, RefusalKind.UNAVAILABLE, f"the worker failed: {exc}")
    await layer.send(reply, answer)


@shared_task(
    name="inference.tokenize",
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    time_limit=GENERATE_TIME_LIMIT_S,  # a model load may come first
)
def tokenize(payload: dict) -> None:
    """Tokenize or detokenize: payload = {"job": TokenJob.to_dict(), "spec":
    ModelSpec.to_wire(), "reply": channel name}. Claimed like a generation, then one "done"
    message with the tokens (TokenResult.to_dict()) or an error event. Idempotent."""
    reply = _reply_channel(payload, "tokenize")
    if reply is None:
        return
    asyncio.run(_answer_once(runtime(), payload, reply, job_type=TokenJob, compute=serve_tokens,
                             field="tokens", refused=TokenError))  # fmt: skip


# Not acks_late: the job's token serves one transfer, so a redelivery could only fail.
@shared_task(name=COPY_TASK, ignore_result=True, time_limit=24 * 3600)
def copy_model(payload: dict) -> None:
    """Fetch a model's file from the web box: payload = CopyJob.to_dict(); the result is this
    worker's CopyStatus in Redis."""
    try:
        job = CopyJob.from_dict(payload)
    except (TypeError, ValueError) as exc:
        log.error("dropping a malformed copy task: %s", exc)
        return
    rt = runtime()
    target = copy_worker.copy_model(job, rt.name, rt.redis)
    if target is not None:
        rt.index.add(target, job.sha256)  # announced at the next heartbeat, not hashed again


def _reply_channel(payload: object, task: str) -> str | None:
    """Where a task's answer goes; None (logged) when the payload names none: with nobody to
    tell, the task is dropped."""
    reply = payload.get("reply") if isinstance(payload, dict) else None
    if not isinstance(reply, str) or not reply:
        log.error("dropping a %s task without a reply channel", task)
        return None
    return reply


def serve(rt: WorkerRuntime, payload: dict) -> None:
    reply = _reply_channel(payload, "generate")
    if reply is None:
        return
    # One event loop per task thread: the channel layer keeps its Redis connections per loop.
    asyncio.run(_serve(rt, payload, reply))


async def _serve(rt: WorkerRuntime, payload: dict, reply: str) -> None:
    layer = get_channel_layer()
    raw = payload.get("request")
    rid = str(raw.get("request_id", "")) if isinstance(raw, dict) else ""
    try:
        request = GenerationRequest.from_wire(raw)
        spec = ModelSpec.from_wire(payload["spec"])
    except Refused as exc:
        await layer.send(reply, exc.refusal.event(rid))
        return
    except (KeyError, TypeError, ValueError) as exc:
        await layer.send(reply, error_event(rid, RefusalKind.INVALID, f"malformed request: {exc}"))
        return
    rid = request.request_id
    with rt.track(rid) as running:
        # 1. Checked after tracking starts, so a cancel racing this check is not lost.
        started, closed = rt.marks(rid)
        if closed:
            log.info("%s: nobody waits for it any more; not running it", rid)
            await layer.send(reply, cancelled_event(rid))
            return
        if started:
            log.warning("%s: redelivered after it had started; not running it twice", rid)
            await layer.send(reply, error_event(
                rid, RefusalKind.UNAVAILABLE,
                "the inference worker stopped while answering; the request is not run twice",
            ))  # fmt: skip
            rt.mark_closed(rid)
            return
        # 2.
        if not await asyncio.to_thread(rt.claim, rid, request.cache_key):
            log.info("%s: another worker took it first; not running it", rid)
            return
        await layer.send(reply, claimed_event(rid, rt.name, rt.instance))
        try:
            spec = await asyncio.to_thread(rt.local_spec, spec)
            await _answer(rt, running, request, spec, layer, reply)
        except Exception as exc:  # noqa: BLE001 - whatever broke, the client hears about it
            if isinstance(exc, Refused):  # no copy of the model on this box
                failure = exc.refusal.event(rid)
            else:
                log.exception("%s failed", rid)
                failure = error_event(rid, RefusalKind.UNAVAILABLE, f"the worker failed: {exc}")
            try:
                await layer.send(reply, failure)
            except Exception:  # noqa: BLE001 - Redis itself is gone: nobody can be told
                log.warning("%s: could not report the failure", rid)
        finally:
            try:  # 4.
                rt.mark_closed(rid)
            except Exception:  # noqa: BLE001
                log.warning("%s: could not mark it closed", rid)


async def _answer(
    rt: WorkerRuntime, running, request: GenerationRequest, spec: ModelSpec, layer, reply
) -> None:
    rid = request.request_id
    if running.cancelled:  # cancelled while it waited in the queue
        await layer.send(reply, cancelled_event(rid))
        return
    loop = asyncio.get_running_loop()
    deadlines = []

    def attach(handle) -> None:
        running.attach(handle)
        deadlines.append(loop.call_later(GENERATE_TIME_LIMIT_S, handle.cancel))

    # 3. Serving may load the model (seconds to minutes); this loop serves only this task.
    started = False
    try:
        async for event in serve_generation(rt.host, request, spec, on_handle=attach):
            if event["type"] == "token" and not started:
                started = True
                rt.mark_started(rid)
            await layer.send(reply, event)
    except ChannelFull:
        log.warning("%s: the client stopped reading; cancelling", rid)
    finally:
        for deadline in deadlines:
            deadline.cancel()
