"""What one inference worker process holds: its engine host and runner supervisor, the requests
it is answering, and the threads that make it visible and reachable from the web side.

- heartbeat: SET appliance:worker:<name>:alive = <instance id> every second with a short TTL, so
  a client knows within seconds that the worker answering it died (a restarted worker with the
  same name has a new instance id, so it does not vouch for its predecessor's requests).
- telemetry: every TELEMETRY_INTERVAL_S, the worker's snapshot (inference.serving.feed) into a
  Redis key that SplitClient.snapshots() reads, and to the dashboards (feed.publish).
- listener: pub/sub "appliance:cancel" (a request id), "appliance:priority" (a request's new
  priority) and "appliance:control" (load/unload).

No database here: a worker on another box only has Redis and the model files.
"""

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import redis
from channels.layers import get_channel_layer
from django.conf import settings

from inference.engine.events import RequestHandle
from inference.engine.generation import Priority
from inference.serving import split_protocol as keys
from inference.serving.feed import publish, worker_snapshot
from inference.serving.hosting import make_host, make_supervisor
from inference.serving.worker_control import execute_control

log = logging.getLogger(__name__)

RETRY_AFTER_REDIS_ERROR_S = 1.0


class Running:
    """One request this worker is answering. A cancel or a new priority may arrive before the
    engine has the request (the model still loading): it is remembered and applied when the
    handle comes."""

    __slots__ = ("request_id", "handle", "cancelled", "priority", "_lock")

    def __init__(self, request_id: str):
        self.request_id = request_id
        self.handle: RequestHandle | None = None
        self.cancelled = False
        self.priority: Priority | None = None  # set while it runs; None: as it was asked
        self._lock = threading.Lock()

    def attach(self, handle: RequestHandle) -> None:
        with self._lock:
            self.handle = handle
            cancelled, priority = self.cancelled, self.priority
        if priority is not None:
            handle.set_priority(priority)
        if cancelled:
            handle.cancel()

    def set_priority(self, priority: Priority) -> None:
        with self._lock:
            self.priority = priority
            handle = self.handle
        if handle is not None:
            handle.set_priority(priority)

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            handle = self.handle
        if handle is not None:
            handle.cancel()


class WorkerRuntime:
    def __init__(self, name: str, redis_url: str):
        self.name = name
        self.instance = uuid.uuid4().hex
        self.redis = keys.connect(redis_url)
        self.supervisor = make_supervisor()
        self.host = make_host(self.supervisor)
        self._running: dict[str, Running] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> "WorkerRuntime":
        self.host.start_sweeper()
        self._beat()  # visible at once, before the first task can be claimed
        for target, label in (
            (self._heartbeat_loop, "heartbeat"),
            (self._telemetry_loop, "telemetry"),
            (self._listen_loop, "cancel-listener"),
        ):
            thread = threading.Thread(target=target, name=f"{label}-{self.name}", daemon=True)
            thread.start()
            self._threads.append(thread)
        log.info("inference worker %s (instance %s) is up", self.name, self.instance)
        return self

    def stop(self) -> None:
        """A clean shutdown: disappear from Redis at once, then free the models."""
        self._stop.set()
        try:
            if self.redis.get(keys.alive_key(self.name)) == self.instance:
                self.redis.delete(keys.alive_key(self.name), keys.snapshot_key(self.name))
        except redis.RedisError as exc:
            log.warning("could not remove worker %s from Redis: %s", self.name, exc)
        for thread in self._threads:
            thread.join(timeout=3)
        self.host.shutdown()

    # --- requests --------------------------------------------------------------------------------

    @contextmanager
    def track(self, request_id: str) -> Iterator[Running]:
        running = Running(request_id)
        with self._lock:
            self._running[request_id] = running
        try:
            yield running
        finally:
            with self._lock:
                if self._running.get(request_id) is running:
                    del self._running[request_id]

    def cancel(self, request_id: str) -> bool:
        with self._lock:
            running = self._running.get(request_id)
        if running is None:
            return False
        running.cancel()
        log.info("cancelled %s", request_id)
        return True

    def set_priority(self, request_id: str, priority: Priority) -> bool:
        """Apply a new priority to a request this worker answers; False (ignored) for one it
        does not have: every worker hears every priority message."""
        with self._lock:
            running = self._running.get(request_id)
        if running is None:
            return False
        running.set_priority(priority)
        log.info("%s is %s now", request_id, priority)
        return True

    def running_count(self) -> int:
        with self._lock:
            return len(self._running)

    # --- request marks ---------------------------------------------------------------------------

    def marks(self, request_id: str) -> tuple[bool, bool]:
        """(started, closed) for a request about to run."""
        started, closed = self.redis.mget(keys.started_key(request_id), keys.closed_key(request_id))
        return started is not None, closed is not None

    def mark_started(self, request_id: str) -> None:
        self.redis.set(keys.started_key(request_id), self.name, ex=keys.REQUEST_MARK_TTL_S)

    def mark_closed(self, request_id: str) -> None:
        self.redis.set(keys.closed_key(request_id), self.name, ex=keys.REQUEST_MARK_TTL_S)

    # --- threads ---------------------------------------------------------------------------------

    def _beat(self) -> None:
        self.redis.set(
            keys.alive_key(self.name), self.instance, px=int(keys.HEARTBEAT_TTL_S * 1000)
        )

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(keys.HEARTBEAT_INTERVAL_S):
            try:
                self._beat()
            except redis.RedisError as exc:
                log.warning("heartbeat failed: %s", exc)

    def snapshot(self) -> dict:
        return worker_snapshot(self.host, self.name, mode="split", supervisor=self.supervisor)

    def _telemetry_loop(self) -> None:
        # One event loop for this thread: the channel layer keeps its connections per loop.
        asyncio.run(self._publish_telemetry())

    async def _publish_telemetry(self) -> None:
        layer = get_channel_layer()
        while not self._stop.is_set():
            try:
                snapshot = await asyncio.to_thread(self.snapshot)
                self.redis.set(
                    keys.snapshot_key(self.name), json.dumps(snapshot, default=str),
                    px=int(keys.SNAPSHOT_TTL_S * 1000),
                )  # fmt: skip
                if layer is not None:
                    await publish(layer, snapshot)
            except Exception as exc:  # noqa: BLE001 - a failed reading must not stop the feed
                log.warning("publishing telemetry failed: %s", exc)
            await asyncio.sleep(settings.TELEMETRY_INTERVAL_S)

    def _listen_loop(self) -> None:
        cancel = keys.cancel_channel(self.redis)
        priority = keys.priority_channel(self.redis)
        control = keys.control_channel(self.redis)
        while not self._stop.is_set():
            pubsub = self.redis.pubsub(ignore_subscribe_messages=True)
            try:
                pubsub.subscribe(cancel, priority, control)
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=1.0)
                    if message is None:
                        continue
                    if message["channel"] == cancel:
                        self.cancel(str(message["data"]))
                    elif message["channel"] == priority:
                        change = keys.read_priority(message["data"])
                        if change is not None:
                            self.set_priority(*change)
                    elif message["channel"] == control:
                        self._control(message["data"])
            except redis.RedisError as exc:
                log.warning("cancel listener lost Redis (%s); reconnecting", exc)
                time.sleep(RETRY_AFTER_REDIS_ERROR_S)
            finally:
                try:
                    pubsub.close()
                except redis.RedisError:
                    pass

    def _control(self, data: str) -> None:
        """Run a load/unload on its own thread: a load can take minutes, and cancels must still
        be heard meanwhile."""
        try:
            command = json.loads(data)
        except ValueError:
            log.warning("ignoring a control message that is not JSON")
            return
        if not isinstance(command, dict):
            return
        threading.Thread(
            target=execute_control, args=(self.host, self.name, self.redis, command),
            name=f"control-{self.name}", daemon=True,
        ).start()  # fmt: skip
