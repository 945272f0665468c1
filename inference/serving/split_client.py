"""SplitClient: the inference client of split mode (REDIS_URL set), the web side of
inference.serving.worker. The same interface as inference.serving.client.EmbeddedClient.

A request, step by step:
1. Make a reply channel on the channel layer, choose the worker (inference.serving.routing, from
   the workers' announcements and the worker that served the conversation, by its cache key)
   and publish the Celery task "inference.generate" to that worker's own queue with the
   request (GenerationRequest.to_wire), the model's spec and the reply channel; with no worker
   announced, to the shared queue "inference". A model no worker can take is refused here, with
   the router's reason. Publishing blocks, so it runs in a thread, with short connect timeouts
   and a capped retry: an unreachable Redis is one "unavailable" error event within seconds.
2. Relay the events that arrive on the reply channel until done or error. The worker's first
   message, "claimed", names it; from then on the client watches that worker's heartbeat, and a
   heartbeat that stops is an error event within seconds. Before a claim the request may wait
   in the queue as long as its worker is alive (busy), up to QUEUE_WAIT_S; if the chosen worker's
   heartbeat stops first, the request is routed again, avoiding it (the copy left in the dead
   worker's queue never runs: a request is claimed once); with no worker alive for
   WORKER_WAIT_S it is an error ("no inference worker is running"). The final event carries
   "route": {"worker", "reason"}, which the request history records.
3. Leaving early (the consumer went away, a stop, a client-side error) marks the request closed
   and publishes its id on appliance:cancel: the worker running it cancels it, and a worker
   that picks it from the queue later does not run it. A new priority (set_priority) goes the
   same way, on appliance:priority.

Embeddings (`embed()`) go the same way as task "inference.embed": published as in 1, watched
as in 2, answered by one "done" message that carries the vectors; tokens (`tokenize()`,
`detokenize()`) as task "inference.tokenize", answered by one "done" message that carries them.
"""

import asyncio
import json
import logging
import threading
import time
import uuid
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import redis
from channels.layers import channel_layers
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from inference.engine import GenerationRequest
from inference.engine.generation import PRIORITIES, Priority
from inference.engine.host import ModelSpec
from inference.engine.media import Image
from inference.engine.refusals import RefusalKind, Refused, error_event
from inference.engine.tiers.entries import conversation_digest
from inference.serving import split_protocol as protocol
from inference.serving.announcement import WorkerAnnouncement
from inference.serving.copies import ModelCopies
from inference.serving.embeds import EmbedError, EmbedJob, EmbedResult
from inference.serving.routing import NoRoute, Route, Wanted, route
from inference.serving.tokens import TokenError, TokenJob, TokenResult
from inference.serving.worker_control import REPLY_PREFIX

log = logging.getLogger(__name__)

POLL_S = 1.0  # how often a silent stream checks on its worker
WORKER_WAIT_S = 30.0  # no worker alive this long: give up (covers a worker restarting)
QUEUE_WAIT_S = 600.0  # workers alive but none took the request this long: give up
PUBLISH_TIMEOUT_S = 10.0  # the whole publish, retries included
PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.5, "interval_max": 1}
CONTROL_TIMEOUT_S = 600.0  # a load of a large model can take minutes
BROKER_POOL_LIMIT = 16
FINAL = ("done", "error")


class _NoAnswer(Exception):
    """A one-answer task that ended without its answer; `event` is the error event."""

    def __init__(self, event: dict):
        super().__init__(event.get("message", ""))
        self.event = event


class WorkerError(Refused, RuntimeError):
    """The inference workers could not do a load or unload."""

    kind = RefusalKind.UNAVAILABLE


class NoWorker(WorkerError):
    """No inference worker is running."""


def broker_unreachable(request_id: str, exc: BaseException) -> dict:
    if isinstance(exc, TimeoutError):
        reason = f"no answer within {PUBLISH_TIMEOUT_S:.0f} s"
    else:
        reason = str(exc) or type(exc).__name__
    return error_event(
        request_id, RefusalKind.UNAVAILABLE, f"the message broker (Redis) is unreachable: {reason}"
    )


@dataclass(slots=True)
class _Stream:
    """What the client knows about one request in flight."""

    request_id: str
    task: str
    payload: dict
    model: Wanted
    cache_key: str | None = None
    route: Route | None = None  # where it was sent
    avoid: set[str] = field(default_factory=set)  # workers that vanished with it queued
    worker: str | None = None  # who claimed it
    instance: str | None = None
    answered: bool = False  # the worker sent the final event
    suspect: bool = False  # its heartbeat (or, before a claim, its chosen worker's) was missing

    @property
    def route_record(self) -> dict:
        """What the request history keeps of its route."""
        chosen = self.route.worker if self.route else None
        return {"worker": self.worker or chosen or "",
                "reason": self.route.reason if self.route else ""}  # fmt: skip


class SplitClient:
    mode = "split"
    publishes_telemetry = False  # each inference worker publishes its own (worker_state)

    def __init__(
        self,
        redis_url: str | None = None,
        *,
        worker_wait_s: float = WORKER_WAIT_S,
        queue_wait_s: float = QUEUE_WAIT_S,
        control_timeout_s: float = CONTROL_TIMEOUT_S,
    ):
        self.redis_url = redis_url or settings.REDIS_URL
        if not self.redis_url:
            raise ImproperlyConfigured("split mode needs REDIS_URL")
        self.redis = protocol.connect(self.redis_url)
        self.copies = ModelCopies(self.redis)
        self.worker_wait_s = worker_wait_s
        self.queue_wait_s = queue_wait_s
        self.control_timeout_s = control_timeout_s
        self._broker = None
        self._broker_lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}
        self._cancelled: set[str] = set()
        self._layers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _layer(self):
        """A channel layer of this event loop's own for reply channels: channels_redis refuses
        to receive on one layer object from two event loops (a sync view's async_to_sync
        thread next to the ASGI server's loop would otherwise break every stream)."""
        loop = asyncio.get_running_loop()
        layer = self._layers.get(loop)
        if layer is None:
            layer = self._layers[loop] = channel_layers.make_backend("default")
        return layer

    # --- 1. publishing ---------------------------------------------------------------------------

    def _broker_pool(self):
        with self._broker_lock:
            if self._broker is None:
                from celery import current_app as app

                connection = app.connection_for_write(
                    self.redis_url,
                    connect_timeout=protocol.CONNECT_TIMEOUT_S,
                    transport_options={
                        "socket_connect_timeout": protocol.CONNECT_TIMEOUT_S,
                        "socket_timeout": protocol.SOCKET_TIMEOUT_S,
                    },
                )
                self._broker = connection.Pool(limit=BROKER_POOL_LIMIT)
            return self._broker

    def _publish(self, payload: dict, request_id: str, task: str, queue: str) -> None:
        from celery import current_app as app

        with self._broker_pool().acquire(block=True, timeout=PUBLISH_TIMEOUT_S) as connection:
            app.send_task(
                task, args=[payload], task_id=request_id, queue=queue,
                connection=connection, retry=True, retry_policy=PUBLISH_RETRY,
                ignore_result=True,
            )  # fmt: skip

    def choose(self, model: Wanted, cache_key: str | None = None,
               avoid: frozenset[str] = frozenset()) -> Route:  # fmt: skip
        """(In a thread.) The worker for a request of `model` (inference.serving.routing);
        raises NoRoute when none can take it, redis.RedisError when Redis is out."""
        affinity = self.redis.get(protocol.affinity_key(cache_key)) if cache_key else None
        return route(self.announcements(), model, shared_queue=protocol.QUEUE,
                     affinity=affinity, avoid=avoid)  # fmt: skip

    def _dispatch(self, state: _Stream) -> None:
        """(In a thread.) Route the request and publish it to the chosen worker's queue."""
        state.route = self.choose(state.model, state.cache_key, frozenset(state.avoid))
        state.suspect = False
        log.info("%s -> %s (%s)", state.request_id, state.route.worker or state.route.queue,
                 state.route.reason)  # fmt: skip
        self._publish(state.payload, state.request_id, state.task, state.route.queue)

    async def _send(self, state: _Stream) -> dict | None:
        """Step 1 for any task: None once published, else the error event to end with."""
        try:
            await asyncio.wait_for(asyncio.to_thread(self._dispatch, state), PUBLISH_TIMEOUT_S)
        except NoRoute as exc:
            return exc.refusal.event(state.request_id)
        except Exception as exc:  # noqa: BLE001 - any publish failure: the broker is out
            log.warning("publishing %s failed: %s", state.request_id, exc)
            return broker_unreachable(state.request_id, exc)
        return None

    # --- 2. relaying -----------------------------------------------------------------------------

    async def stream(self, request: GenerationRequest, spec: ModelSpec) -> AsyncIterator[dict]:
        rid = request.request_id
        layer = self._layer()
        reply = await layer.new_channel()
        payload = {"request": request.to_wire(), "spec": spec.to_wire(), "reply": reply}
        wanted = Wanted(spec.name, spec.sha256,
                        conversation_digest(request.cache_key) if request.cache_key else "",
                        mmproj_sha256=spec.mmproj_sha256)  # fmt: skip
        state = _Stream(rid, "inference.generate", payload, wanted,
                        cache_key=request.cache_key)  # fmt: skip
        self._streams[rid] = state
        published = False
        try:
            failure = await self._send(state)
            # Routed, then a failed or timed-out publish: it may still go out, so close it too.
            published = state.route is not None
            if failure is not None:
                yield failure
                return
            async for event in self._relay(layer, reply, state):
                yield event
        finally:
            self._streams.pop(rid, None)
            self._cancelled.discard(rid)
            if published and not state.answered:
                # 3. In the background: this may run while the caller's task is being cancelled.
                threading.Thread(target=self._abandon, args=(rid,), daemon=True).start()

    async def _relay(self, layer, reply: str, state: _Stream) -> AsyncIterator[dict]:
        rid = state.request_id
        now = time.monotonic()
        queued_at = last_seen_worker = now
        receiving: asyncio.Future | None = None
        try:
            while True:
                if receiving is None:
                    receiving = asyncio.ensure_future(layer.receive(reply))
                done, _ = await asyncio.wait({receiving}, timeout=POLL_S)
                if done:
                    try:
                        message = receiving.result()
                    except Exception as exc:  # noqa: BLE001 - Redis went away mid-stream
                        yield broker_unreachable(rid, exc)
                        return
                    receiving = None
                    if message.get("type") == "claimed":
                        state.worker, state.instance = message["worker"], message["instance"]
                        state.suspect = False  # from now on, about the claiming worker
                        continue
                    if message.get("type") in FINAL:
                        state.answered = True
                        yield {**message, "route": state.route_record}
                        return
                    yield message
                    continue
                # Silence for POLL_S: is anybody still working on it?
                if rid in self._cancelled and state.worker is None:
                    yield protocol.cancelled_event(rid)  # never reached a worker
                    return
                try:
                    problem, workers_alive = await asyncio.to_thread(self._check, state)
                except redis.RedisError as exc:
                    yield broker_unreachable(rid, exc)
                    return
                now = time.monotonic()
                if problem is None and state.worker is None:
                    if workers_alive:
                        last_seen_worker = now
                    if now - last_seen_worker > self.worker_wait_s:
                        problem = error_event(
                            rid, RefusalKind.UNAVAILABLE, "no inference worker is running"
                        )
                    elif now - queued_at > self.queue_wait_s:
                        waited = f"{self.queue_wait_s:.0f} s"
                        problem = error_event(
                            rid, RefusalKind.BUSY,
                            f"no inference worker took the request within {waited}",
                        )  # fmt: skip
                if problem is not None:
                    yield problem
                    return
        finally:
            if receiving is not None and not receiving.done():
                receiving.cancel()
                await asyncio.gather(receiving, return_exceptions=True)

    def _check(self, state: _Stream) -> tuple[dict | None, bool]:
        """(In a thread.) (an error event if the claiming worker is gone, whether any worker
        is alive). Before a claim, a request whose chosen worker vanished is routed again."""
        if state.worker is None:
            chosen = state.route.worker if state.route else None
            if chosen is not None and not self.redis.exists(protocol.alive_key(chosen)):
                if not state.suspect:  # one more poll for a heartbeat delayed by a loaded box
                    state.suspect = True
                else:
                    log.warning("worker %s vanished with %s queued; routing it again",
                                chosen, state.request_id)  # fmt: skip
                    state.avoid.add(chosen)
                    try:
                        self._dispatch(state)
                    except NoRoute as exc:
                        return exc.refusal.event(state.request_id), True
            return None, bool(self.live_workers())
        alive = self.redis.get(protocol.alive_key(state.worker)) == state.instance
        if alive:
            state.suspect = False
            return None, True
        if not state.suspect:  # give a heartbeat delayed by a loaded box one more poll
            state.suspect = True
            return None, True
        log.warning("worker %s stopped while answering %s", state.worker, state.request_id)
        return error_event(
            state.request_id, RefusalKind.UNAVAILABLE,
            f"the inference worker stopped while answering (worker {state.worker})",
        ), False  # fmt: skip

    async def embed(self, job: EmbedJob, spec: ModelSpec) -> EmbedResult:
        """Embeddings through the task "inference.embed": published and watched as a
        generation is (steps 1 and 2), answered by one "done" message carrying the vectors."""
        payload = {"job": job.to_dict(), "spec": spec.to_wire()}
        try:
            answer = await self._one_answer(
                "inference.embed", payload, spec, job.request_id, "embedding",
                "the embedding was not computed",
            )  # fmt: skip
        except _NoAnswer as exc:
            raise EmbedError(exc.event) from None
        return EmbedResult.from_dict(answer)

    async def tokenize(
        self, spec: ModelSpec, text: str, *, add_special: bool = True, parse_special: bool = True,
        with_pieces: bool = False, if_loaded: bool = False, images: tuple[Image, ...] = (),
    ) -> TokenResult:  # fmt: skip
        job = TokenJob(spec.name, "tokenize", text=text, add_special=add_special,
                       parse_special=parse_special, with_pieces=with_pieces,
                       if_loaded=if_loaded, images=images)  # fmt: skip
        return await self._tokens(job, spec)

    async def detokenize(self, spec: ModelSpec, ids: list[int]) -> TokenResult:
        return await self._tokens(TokenJob(spec.name, "detokenize", tokens=list(ids)), spec)

    async def _tokens(self, job: TokenJob, spec: ModelSpec) -> TokenResult:
        """Through the task "inference.tokenize", as embeddings go."""
        payload = {"job": job.to_dict(), "spec": spec.to_wire()}
        try:
            answer = await self._one_answer(
                "inference.tokenize", payload, spec, job.request_id, "tokens",
                "the tokens were not computed",
            )  # fmt: skip
        except _NoAnswer as exc:
            raise TokenError(exc.event) from None
        return TokenResult.from_dict(answer)

    async def _one_answer(
        self, task: str, payload: dict, spec: ModelSpec, rid: str, key: str, unanswered: str
    ) -> dict:
        """Publish a task that is answered by one "done" message carrying `key` (steps 1 and 2)
        and return what it carries; raises _NoAnswer with the error event otherwise."""
        layer = self._layer()
        reply = await layer.new_channel()
        wanted = Wanted(spec.name, spec.sha256, mmproj_sha256=spec.mmproj_sha256)
        state = _Stream(rid, task, {**payload, "reply": reply}, wanted)
        self._streams[rid] = state
        try:
            failure = await self._send(state)
            if failure is not None:
                raise _NoAnswer(failure)
            async for message in self._relay(layer, reply, state):
                if message.get("type") == "done" and key in message:
                    return message[key]
                if message.get("type") in FINAL:
                    break
            else:
                message = error_event(
                    rid, RefusalKind.UNAVAILABLE, "the inference worker gave no answer"
                )
            if message.get("type") != "error":
                message = error_event(rid, RefusalKind.UNAVAILABLE, unanswered)
            raise _NoAnswer(message)
        finally:
            self._streams.pop(rid, None)

    # --- 3. cancelling, and changing a priority --------------------------------------------------

    def _abandon(self, request_id: str) -> None:
        """Nobody waits for this request any more: a queued copy must not run, a running one
        must stop."""
        try:
            with self.redis.pipeline() as pipe:
                pipe.set(protocol.closed_key(request_id), "client",
                         ex=protocol.REQUEST_MARK_TTL_S)  # fmt: skip
                pipe.publish(protocol.cancel_channel(self.redis), request_id)
                pipe.execute()
        except redis.RedisError as exc:
            log.warning("could not cancel %s: %s", request_id, exc)

    async def cancel(self, request_id: str) -> None:
        """Stop a generation: a running one ends with finish_reason "cancelled"."""
        if request_id in self._streams:
            self._cancelled.add(request_id)
        await asyncio.to_thread(self._abandon, request_id)

    def _publish_priority(self, request_id: str, priority: Priority) -> None:
        try:
            self.redis.publish(protocol.priority_channel(self.redis),
                               protocol.priority_message(request_id, priority))  # fmt: skip
        except redis.RedisError as exc:
            log.warning("could not change the priority of %s: %s", request_id, exc)

    async def set_priority(self, request_id: str, priority: Priority) -> None:
        """Every worker hears it; the one answering the request applies it (worker_state)."""
        if priority not in PRIORITIES:
            raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}")
        await asyncio.to_thread(self._publish_priority, request_id, priority)

    # --- models and telemetry --------------------------------------------------------------------

    def live_workers(self) -> list[str]:
        """Names of the inference workers whose heartbeat is current."""
        # One SCAN pass over the database per request: large batches, few round trips.
        names = self.redis.scan_iter(match=protocol.ALIVE_PATTERN, count=1000)
        return sorted(protocol.worker_from_key(key) for key in names)

    def announcements(self) -> list[WorkerAnnouncement]:
        """What every live inference worker announced (its models, load, free memory), by
        worker name; a worker without a current heartbeat is left out, and so is a garbled
        announcement (logged)."""
        names = self.live_workers()
        if not names:
            return []
        raw = self.redis.mget([protocol.announce_key(name) for name in names])
        found = []
        for name, value in zip(names, raw, strict=True):
            if not value:
                continue  # alive, but not announced yet (starting)
            try:
                found.append(WorkerAnnouncement.from_json(value))
            except ValueError as exc:
                log.warning("ignoring the announcement of %s: %s", name, exc)
        return found

    def _control(self, command: dict, timeout: float) -> list[dict]:
        """(In a thread.) Broadcast a command; the answers of every worker that heard it, or of
        the one worker it names ("worker")."""
        reply = f"{REPLY_PREFIX}{uuid.uuid4().hex}"
        addressed = command.get("worker")
        try:
            expected = {addressed} if addressed else set(self.live_workers())
            heard = self.redis.publish(
                protocol.control_channel(self.redis), json.dumps({**command, "reply": reply})
            )
        except redis.RedisError as exc:
            raise WorkerError(f"the message broker (Redis) is unreachable: {exc}") from exc
        if not heard:
            raise NoWorker("no inference worker is running")
        if addressed:
            heard = 1  # the others hear it and keep silent
        answers: dict[str, dict] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(answers) < heard and time.monotonic() < deadline:
                item = self.redis.blpop([reply], timeout=1)
                if item is not None:
                    answer = json.loads(item[1])
                    answers[str(answer.get("worker"))] = answer
                    continue
                # A worker that died after hearing the command never answers: stop waiting
                # once every worker still alive has answered.
                waiting = (expected & set(self.live_workers())) - set(answers)
                if answers and not waiting:
                    break
        except redis.RedisError as exc:
            raise WorkerError(f"the message broker (Redis) is unreachable: {exc}") from exc
        finally:
            try:
                self.redis.delete(reply)
            except redis.RedisError:
                pass
        if not answers:
            raise WorkerError(f"no inference worker answered within {timeout:.0f} s")
        return list(answers.values())

    @staticmethod
    def _raise_failures(answers: list[dict]) -> None:
        failures = [a for a in answers if not a.get("ok")]
        if not failures:
            return
        message = "; ".join(f"{a.get('worker')}: {a.get('message')}" for a in failures)
        kinds = {a.get("error") for a in failures}
        if len(kinds) == 1 and kinds <= set(RefusalKind):  # every worker said the same no
            raise WorkerError(message, kind=RefusalKind(kinds.pop()))
        raise WorkerError(message)

    async def load(self, spec: ModelSpec, *, worker: str | None = None) -> None:
        """Load the model on one worker: `worker` if named (a box chosen on the dashboard),
        else the router's choice (inference.serving.routing): the worker that has it loaded
        already (its load is a no-op, or a reload for a larger context), else one with the
        file and room, else a second copy when every copy is full and requests wait; with none
        announced yet, on every worker. Raises if it could not."""
        if worker is None:
            try:
                wanted = Wanted(spec.name, spec.sha256, mmproj_sha256=spec.mmproj_sha256)
                worker = (await asyncio.to_thread(self.choose, wanted)).worker
            except NoRoute as exc:
                raise WorkerError(exc.message, kind=exc.kind) from None
            except redis.RedisError as exc:
                raise WorkerError(f"the message broker (Redis) is unreachable: {exc}") from exc
        command = {"op": "load", "spec": spec.to_wire()}
        if worker is not None:
            command["worker"] = worker
        answers = await asyncio.to_thread(self._control, command, self.control_timeout_s)
        self._raise_failures(answers)

    async def unload(self, name: str) -> bool:
        """Unload the model wherever it is loaded; True if some worker had it."""
        return await asyncio.to_thread(self._unload, name)

    def _unload(self, name: str) -> bool:
        try:
            answers = self._control({"op": "unload", "name": name}, self.control_timeout_s)
        except NoWorker:
            return False  # nothing is loaded anywhere
        unloaded = any(a.get("ok") and a.get("result") for a in answers)
        if not unloaded:
            self._raise_failures(answers)
        return unloaded

    async def forget_prompts(
        self, *, partition: str | None = None, model: ModelSpec | None = None,
        everything: bool = False,
    ) -> int:  # fmt: skip
        """Every worker forgets them on its own box (inference.serving.kept_prompts); the
        entries forgotten, all workers together. The forget is recorded in Redis first, so a
        worker that is not up now does it when it is back (worker_control.catch_up_forgets)."""
        command = {"op": "forget", "partition": partition, "everything": everything,
                   "spec": model.to_wire() if model is not None else None}  # fmt: skip
        command["n"] = await asyncio.to_thread(self._record_forget, command)
        try:
            answers = await asyncio.to_thread(self._control, command, self.control_timeout_s)
        except NoWorker:
            return 0
        self._raise_failures(answers)
        return sum(int(a.get("result") or 0) for a in answers if a.get("ok"))

    def _record_forget(self, command: dict) -> int:
        """(In a thread.) Number a forget and keep it among the latest (split_protocol)."""
        try:
            return protocol.keep_forget(self.redis, command)
        except redis.RedisError as exc:
            raise WorkerError(f"the message broker (Redis) is unreachable: {exc}") from exc

    def reload_previous(self) -> None:
        """Each inference worker loads again what it had loaded (WorkerRuntime.start)."""

    def unload_idle(self) -> list[str]:
        """Every worker sweeps its own host already; this is the safety net on the beat's
        schedule, from the workers' snapshots. A model used since its snapshot was taken may go
        early (it reloads on its next request); a busy one is refused by its worker."""
        expired = sorted({
            row["name"]
            for snap in self.snapshots()
            for row in snap.get("loaded") or []
            if row.get("expires_in") is not None and row["expires_in"] <= 0
            and not row.get("busy")
        })  # fmt: skip
        unloaded = []
        for name in expired:
            try:
                if self._unload(name):
                    unloaded.append(name)
            except Exception as exc:  # noqa: BLE001 - busy again, or a worker gone: next time
                log.info("idle unload of %s skipped: %s", name, exc)
        return unloaded

    def snapshots(self) -> list[dict]:
        """The latest snapshot of every live inference worker (empty if Redis is out)."""
        try:
            names = self.live_workers()
            if not names:
                return []
            raw = self.redis.mget([protocol.snapshot_key(name) for name in names])
        except redis.RedisError as exc:
            log.warning("cannot read worker snapshots: %s", exc)
            return []
        snapshots = []
        for value in raw:
            if value:
                try:
                    snapshots.append(json.loads(value))
                except ValueError:
                    log.warning("a worker snapshot is not JSON")
        return snapshots
