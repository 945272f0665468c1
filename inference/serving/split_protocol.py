"""What the web side and the inference workers agree on in split mode: Redis names, timings,
and the few messages that are not engine events.

Everything a worker says about itself lives in Redis under "appliance:worker:<name>:…" with a
short TTL, so a worker that dies simply disappears: nothing has to clean up after it.

    appliance:worker:<name>:alive     the worker's instance id, TTL HEARTBEAT_TTL_S
    appliance:worker:<name>:snapshot  its latest inference.serving.feed.worker_snapshot() as JSON
    appliance:worker:<name>:announce  its WorkerAnnouncement (inference.serving.announcement) as
                                      JSON, TTL ANNOUNCE_TTL_S, rewritten every heartbeat
    appliance:affinity:<cache key>    the worker that last claimed a request of this
                                      conversation (TTL AFFINITY_TTL_S): its KV is there
    appliance:req:<id>:claimed        the instance that took the request (SET NX): a copy routed
                                      again after its worker vanished runs only once
    appliance:req:<id>:started        set when the request's first token went out
    appliance:req:<id>:closed         nobody waits for this request any more: never run it
    appliance:cancel                  pub/sub: a request id to cancel, heard by every worker
    appliance:priority                pub/sub: {"request_id", "priority"} (JSON), a running
                                      request's new priority; workers without it ignore it
    appliance:control                 pub/sub: load/unload commands, heard by every worker
    appliance:forgets                 the latest MAX_FORGETS "forget" control commands (JSON),
                                      each numbered ("n") from appliance:forgets:next before it
                                      is broadcast: a worker that was away does them when it is
                                      back (worker_control.catch_up_forgets)
    appliance:copy:…                  a model copied to a box: its one-time tokens and each
                                      worker's progress (inference.serving.copies has them)

Keys live in the Redis database of REDIS_URL, but pub/sub channels are global to the server, so
their names carry the database number (when it is not 0): two appliances, or a test run, sharing
one Redis server never hear each other's cancels.
"""

import json

import redis

from inference.engine.generation import MAX_ID_CHARS, PRIORITIES, Priority

QUEUE = "inference"  # the shared Celery queue of "inference.generate" (and embed, tokenize)

PREFIX = "appliance"

HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_TTL_S = 3.0  # a worker silent this long is gone
SNAPSHOT_TTL_S = 5.0
# An announcement outlives a slow reading (a runner busy loading); whether its worker is alive
# is the heartbeat's to say.
ANNOUNCE_TTL_S = 5.0
# A conversation's worker is remembered as long as its prefix cache plausibly keeps its turn.
AFFINITY_TTL_S = 3600
# Request marks outlive the broker's visibility timeout (1 h), after which Celery redelivers a
# task whose worker died: the mark must still be there to stop it from running twice.
REQUEST_MARK_TTL_S = 2 * 3600

# Every Redis call from the web side is bounded: a Redis that does not answer must turn into an
# error event within seconds, never a hung request.
CONNECT_TIMEOUT_S = 3.0
SOCKET_TIMEOUT_S = 5.0


def alive_key(worker: str) -> str:
    return f"{PREFIX}:worker:{worker}:alive"


def snapshot_key(worker: str) -> str:
    return f"{PREFIX}:worker:{worker}:snapshot"


def announce_key(worker: str) -> str:
    return f"{PREFIX}:worker:{worker}:announce"


def worker_queue(worker: str) -> str:
    """The Celery queue only this worker consumes (besides the shared QUEUE): the router sends
    a request here to choose its worker."""
    return f"{QUEUE}.{worker}"


def affinity_key(cache_key: str) -> str:
    return f"{PREFIX}:affinity:{cache_key}"


def worker_from_key(key: str) -> str:
    """The worker name inside an "appliance:worker:<name>:<what>" key."""
    return key[len(f"{PREFIX}:worker:") : key.rindex(":")]


ALIVE_PATTERN = f"{PREFIX}:worker:*:alive"
ANNOUNCE_PATTERN = f"{PREFIX}:worker:*:announce"


def started_key(request_id: str) -> str:
    return f"{PREFIX}:req:{request_id}:started"


def claimed_key(request_id: str) -> str:
    return f"{PREFIX}:req:{request_id}:claimed"


def closed_key(request_id: str) -> str:
    return f"{PREFIX}:req:{request_id}:closed"


FORGETS = f"{PREFIX}:forgets"
FORGETS_NEXT = f"{PREFIX}:forgets:next"
MAX_FORGETS = 1000  # a box away for more than this many forgets forgets all it keeps
# Numbered and kept in one step: a worker catching up never sees a number before a lower one.
_KEEP_FORGET = """
local n = redis.call('INCR', KEYS[2])
redis.call('RPUSH', KEYS[1], n .. ' ' .. ARGV[1])
redis.call('LTRIM', KEYS[1], -tonumber(ARGV[2]), -1)
return n
"""


def keep_forget(client: redis.Redis, command: dict) -> int:
    """Number a "forget" control command and keep it among the latest; its number."""
    return int(client.eval(_KEEP_FORGET, 2, FORGETS, FORGETS_NEXT, json.dumps(command),
                           MAX_FORGETS))  # fmt: skip


def kept_forgets(client: redis.Redis) -> list[dict]:
    """The kept forgets, in order, each with its number as "n" (a garbled one is skipped)."""
    commands = []
    for raw in client.lrange(FORGETS, 0, -1):
        number, _, text = str(raw).partition(" ")
        try:
            command = json.loads(text)
            n = int(number)
        except ValueError:
            continue
        if isinstance(command, dict):
            commands.append({**command, "n": n})
    return sorted(commands, key=lambda command: command["n"])


def _channel(name: str, client: redis.Redis) -> str:
    db = client.connection_pool.connection_kwargs.get("db", 0)
    return f"{PREFIX}:{name}" if not db else f"{PREFIX}:{name}:db{db}"


def cancel_channel(client: redis.Redis) -> str:
    return _channel("cancel", client)


def priority_channel(client: redis.Redis) -> str:
    return _channel("priority", client)


def control_channel(client: redis.Redis) -> str:
    return _channel("control", client)


def connect(url: str) -> redis.Redis:
    """A thread-safe Redis client with bounded connect and read times."""
    return redis.Redis.from_url(
        url,
        decode_responses=True,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        socket_timeout=SOCKET_TIMEOUT_S,
        health_check_interval=30,
    )


def claimed_event(request_id: str, worker: str, instance: str) -> dict:
    """The worker's first message on a reply channel: whose heartbeat the client must watch."""
    return {"type": "claimed", "request_id": request_id, "worker": worker, "instance": instance}


def priority_message(request_id: str, priority: Priority) -> str:
    """What SplitClient.set_priority publishes on the priority channel."""
    return json.dumps({"request_id": request_id, "priority": priority})


def read_priority(data: str) -> tuple[str, Priority] | None:
    """(request id, priority) from a priority message; None for anything else (a garbled or
    foreign message is dropped, never raised in the listener)."""
    try:
        message = json.loads(data)
    except (TypeError, ValueError):
        return None
    if not isinstance(message, dict):
        return None
    request_id, priority = message.get("request_id"), message.get("priority")
    if not isinstance(request_id, str) or not 0 < len(request_id) <= MAX_ID_CHARS:
        return None
    if priority not in PRIORITIES:
        return None
    return request_id, priority


def cancelled_event(request_id: str) -> dict:
    """The end of a request cancelled before the engine had it (no figures: it never ran)."""
    return {"type": "done", "request_id": request_id, "finish_reason": "cancelled", "text": "",
            "figures": {}}  # fmt: skip
