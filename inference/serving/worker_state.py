"""What one inference worker process holds: its engine host and runner supervisor, the requests
it is answering, and the threads that make it visible and reachable from the web side.

- heartbeat: SET appliance:worker:<name>:alive = <instance id> every second with a short TTL, so
  a client knows within seconds that the worker answering it died (a restarted worker with the
  same name has a new instance id, so it does not vouch for its predecessor's requests).
- announcer: every heartbeat interval, the worker's WorkerAnnouncement (the models it can serve
  by sha256, the loaded ones and their free slots, its load, its free memory) under
  appliance:worker:<name>:announce, which the split client's router reads.
- indexer: every INDEX_REFRESH_S, this box's model files by sha256 (inference.serving.model_index);
  a request names its model by digest and runs on this box's own copy (`local_spec`).
- telemetry: every TELEMETRY_INTERVAL_S, the worker's snapshot (inference.serving.feed) into a
  Redis key that SplitClient.snapshots() reads, and to the dashboards (feed.publish).
- listener: pub/sub "appliance:cancel" (a request id), "appliance:priority" (a request's new
  priority) and "appliance:control" (load/unload/forget); each time it subscribes, it does the
  forgets of kept prompts broadcast while it was away (worker_control.catch_up_forgets).

No database here: a worker on another box only has Redis and the model files.
"""

import asyncio
import dataclasses
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import redis
from channels.layers import get_channel_layer
from django.conf import settings

from inference.catalog.starter import packaged_models
from inference.engine.events import RequestHandle
from inference.engine.generation import Priority
from inference.engine.host import ModelSpec
from inference.engine.refusals import RefusalKind, Refused
from inference.engine.tiers import files
from inference.engine.tiers.entries import conversation_digest
from inference.planning.machine import free_gpu_bytes, gpu_readings
from inference.serving import split_protocol as keys
from inference.serving.announcement import MAX_WARM, LoadedModel, WorkerAnnouncement
from inference.serving.feed import publish, worker_snapshot
from inference.serving.hosting import make_host, make_supervisor, reload_previous
from inference.serving.model_index import ModelIndex
from inference.serving.worker_control import catch_up_forgets, execute_control

log = logging.getLogger(__name__)

RETRY_AFTER_REDIS_ERROR_S = 1.0
INDEX_REFRESH_S = 30.0  # a model file copied onto the box is announced within this
DISK_WARM_EVERY_S = 30.0  # the kept conversations on disk are read again after this


class NoCopy(Refused, LookupError):
    """This box has no file with the model's sha256."""

    kind = RefusalKind.UNAVAILABLE


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
        self.queue = keys.worker_queue(name)
        self.hostname = socket.gethostname()
        self.redis = keys.connect(redis_url)
        self.index = ModelIndex(
            [settings.MODELS_DIR], [path for _, path in packaged_models()],
            cache_file=settings.DATA_DIR / "model-index.json",
        )  # fmt: skip
        self.supervisor = make_supervisor(name)
        self.host = make_host(self.supervisor, name)
        self._running: dict[str, Running] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._indexed = threading.Event()  # the first pass over the model files is done
        self._threads: list[threading.Thread] = []
        self._disk_warm: list[str] = []
        self._disk_warm_at = -DISK_WARM_EVERY_S

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> "WorkerRuntime":
        self.host.start_sweeper()
        reload_previous(self.host, self.name, resolve=self.local_spec)
        self._beat()  # visible at once, before the first task can be claimed
        for target, label in (
            (self._heartbeat_loop, "heartbeat"),
            (self._announce_loop, "announcer"),
            (self._index_loop, "indexer"),
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
                self.redis.delete(keys.alive_key(self.name), keys.snapshot_key(self.name),
                                  keys.announce_key(self.name))  # fmt: skip
        except redis.RedisError as exc:
            log.warning("could not remove worker %s from Redis: %s", self.name, exc)
        for thread in self._threads:
            thread.join(timeout=3)
        self.host.shutdown()
        self.supervisor.close()

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

    def waiting_count(self) -> int:
        """Requests taken but not in an engine yet (their model is loading)."""
        with self._lock:
            return sum(1 for running in self._running.values() if running.handle is None)

    # --- models by content -----------------------------------------------------------------------

    def local_spec(self, spec: ModelSpec) -> ModelSpec:
        """`spec` with this box's own copy of its file, found by sha256; the spec's path only
        when the digest is unknown (not hashed yet). Raises NoCopy when this box lacks it. Its
        draft model likewise, except that a box without a copy of the draft loads the model
        without it (a draft only ever makes answers faster). Its vision projector is part of
        the model: a box without a copy of it lacks the model (NoCopy)."""
        spec = self._local_draft(spec)
        spec = self._local_projector(spec)
        if not spec.sha256:
            return spec
        path = self.index.path_for(spec.sha256)
        if path is None:
            self.index.refresh()  # a copy that arrived since the last pass
            path = self.index.path_for(spec.sha256)
        if path is None:
            raise NoCopy(
                f"inference worker {self.name} has no copy of {spec.name} "
                f"(sha256 {spec.sha256[:12]}…) under {settings.MODELS_DIR}"
            )
        if path == spec.config.model_path:
            return spec
        return dataclasses.replace(spec, config=dataclasses.replace(spec.config, model_path=path))

    def _local_draft(self, spec: ModelSpec) -> ModelSpec:
        config = spec.config
        if not config.draft_model_path or not spec.draft_sha256:
            return spec
        path = self.index.path_for(spec.draft_sha256)
        if path is None:
            self.index.refresh()
            path = self.index.path_for(spec.draft_sha256)
        if path is None:
            log.warning("inference worker %s has no copy of %s's draft model (sha256 %s…): "
                        "it loads without one", self.name, spec.name, spec.draft_sha256[:12])
        if path == config.draft_model_path:
            return spec
        return dataclasses.replace(spec, config=dataclasses.replace(
            config, draft_model_path=path or ""))  # fmt: skip

    def _local_projector(self, spec: ModelSpec) -> ModelSpec:
        config = spec.config
        if not config.mmproj_path or not spec.mmproj_sha256:
            return spec
        path = self.index.path_for(spec.mmproj_sha256)
        if path is None:
            self.index.refresh()
            path = self.index.path_for(spec.mmproj_sha256)
        if path is None:
            raise NoCopy(
                f"inference worker {self.name} has no copy of {spec.name}'s vision projector "
                f"(sha256 {spec.mmproj_sha256[:12]}…) under {settings.MODELS_DIR}"
            )
        if path == config.mmproj_path:
            return spec
        return dataclasses.replace(spec, config=dataclasses.replace(config, mmproj_path=path))

    # --- request marks ---------------------------------------------------------------------------

    def marks(self, request_id: str) -> tuple[bool, bool]:
        """(started, closed) for a request about to run."""
        started, closed = self.redis.mget(keys.started_key(request_id), keys.closed_key(request_id))
        return started is not None, closed is not None

    def mark_started(self, request_id: str) -> None:
        self.redis.set(keys.started_key(request_id), self.name, ex=keys.REQUEST_MARK_TTL_S)

    def mark_closed(self, request_id: str) -> None:
        self.redis.set(keys.closed_key(request_id), self.name, ex=keys.REQUEST_MARK_TTL_S)

    def claim(self, request_id: str, cache_key: str | None) -> bool:
        """Take the request; False when another copy of it was taken first (the client routed
        it again after the worker it chose vanished). The conversation's worker becomes this
        one: its next turn is routed here."""
        claimed = self.redis.set(keys.claimed_key(request_id), self.instance, nx=True,
                                 ex=keys.REQUEST_MARK_TTL_S)  # fmt: skip
        if not claimed and self.redis.get(keys.claimed_key(request_id)) != self.instance:
            return False
        if cache_key:
            self.redis.set(keys.affinity_key(cache_key), self.name, ex=keys.AFFINITY_TTL_S)
        return True

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

    def announcement(self) -> WorkerAnnouncement:
        snapshots = self.host.snapshots()
        loaded = []
        for row in self.host.loaded():
            engine = snapshots.get(row["name"]) or {}
            slots = int(row.get("parallel") or 1)
            running = int(engine.get("active_sequences") or 0)
            loaded.append(LoadedModel(
                name=row["name"], sha256=row.get("sha256") or "",
                n_ctx=int(row.get("ctx_per_seq") or 0), slots_total=slots,
                slots_free=max(0, slots - running), running=running,
                waiting=int(engine.get("queue_depth") or 0),
            ))  # fmt: skip
        if self.host.loading and self.host.loading not in {m.name for m in loaded}:
            # Being loaded: counted as held, so a burst of first requests is not spread over
            # every box that could load it.
            loaded.append(LoadedModel(self.host.loading, "", 0, 1, 1, 0, self.waiting_count()))
        gpus = gpu_readings({os.getpid(), *self.supervisor.pids()})
        warm = [digest for snap in snapshots.values()
                for digest in (snap.get("prompt_cache") or {}).get("conversations") or []]
        warm = list(dict.fromkeys([*warm, *self._kept_on_disk()]))[:MAX_WARM]
        return WorkerAnnouncement(
            worker=self.name, instance=self.instance, host=self.hostname, queue=self.queue,
            serves=self.index.served(), loaded=tuple(loaded),
            queue_depth=self.waiting_count(), running=self.running_count(),
            ram_free_bytes=psutil.virtual_memory().available,
            vram_free_bytes=free_gpu_bytes(gpus),
            time=time.time(), warm=tuple(warm),
        )  # fmt: skip

    def _kept_on_disk(self) -> list[str]:
        """Digests of the conversations this worker keeps on disk, models loaded or not; read
        at most every DISK_WARM_EVERY_S (a header per file)."""
        now = time.monotonic()
        if now - self._disk_warm_at >= DISK_WARM_EVERY_S:
            self._disk_warm_at = now
            keys = files.conversations(Path(self.supervisor.prompt_cache.directory), MAX_WARM)
            self._disk_warm = [conversation_digest(key) for key in keys]
        return self._disk_warm

    def _announce(self) -> None:
        self.redis.set(keys.announce_key(self.name), self.announcement().to_json(),
                       px=int(keys.ANNOUNCE_TTL_S * 1000))  # fmt: skip

    def _announce_loop(self) -> None:
        # Not before the first index pass: an announcement that serves nothing yet would make
        # the router refuse this box's models (alive and unannounced, it is simply not chosen).
        while not self._indexed.wait(keys.HEARTBEAT_INTERVAL_S):
            if self._stop.is_set():
                return
        while True:
            try:
                self._announce()
            except Exception as exc:  # noqa: BLE001 - a failed reading must not stop it
                log.warning("announcing failed: %s", exc)
            if self._stop.wait(keys.HEARTBEAT_INTERVAL_S):
                return

    def _index_loop(self) -> None:
        while True:
            try:
                self.index.refresh()
            except Exception:  # noqa: BLE001 - keep indexing
                log.exception("indexing the model files failed")
            self._indexed.set()
            if self._stop.wait(INDEX_REFRESH_S):
                return

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
                # Heard live from now on; those broadcast while it did not listen, from Redis.
                threading.Thread(target=self._catch_up_forgets, name=f"forgets-{self.name}",
                                 daemon=True).start()  # fmt: skip
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

    def _catch_up_forgets(self) -> None:
        try:
            catch_up_forgets(self.host, self.name, self.redis, self.local_spec,
                             self.supervisor.prompt_cache.directory)  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - the next subscription tries again
            log.warning("%s could not catch up on forgets: %s", self.name, exc)

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
        if command.get("worker") not in (None, self.name):
            return  # addressed to another worker (a load goes to the one the router chose)
        threading.Thread(
            target=execute_control, args=(self.host, self.name, self.redis, command),
            kwargs={"resolve": self.local_spec, "announce": self._announce,
                    "prompts_dir": self.supervisor.prompt_cache.directory},
            name=f"control-{self.name}", daemon=True,
        ).start()  # fmt: skip
