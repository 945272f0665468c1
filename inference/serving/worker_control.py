"""Load and unload commands that reach the inference workers over Redis pub/sub.

Command (JSON on appliance:control); one with "worker": <name> is for that worker only:
    {"op": "load", "spec": ModelSpec.to_wire(), "reply": "appliance:control:reply:<hex>",
     "worker": <the router's choice>}
    {"op": "unload", "name": "<model>", "reply": ...}
    {"op": "forget", "partition": str | null, "spec": ModelSpec.to_wire() | null,
     "everything": bool, "n": int, "reply": ...}   (kept prompts: inference.serving.kept_prompts)
A forget is also kept in Redis, numbered (split_protocol.FORGETS): each worker does them in
order and writes down the last it did in its directory of kept prompts, so a worker that was
away (its box off, or cut from Redis) does the ones it missed when it is back (catch_up_forgets).
Each worker RPUSHes one answer onto the reply list:
    {"worker": name, "ok": true, "result": <bool for unload, true for load>}
    {"worker": name, "ok": false, "error": <a RefusalKind>, "message": str}
"""

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

import redis

from inference.engine.host import EngineHost, ModelSpec
from inference.engine.refusals import RefusalKind, Refused
from inference.serving import kept_prompts
from inference.serving import split_protocol as keys

log = logging.getLogger(__name__)

REPLY_PREFIX = f"{keys.PREFIX}:control:reply:"
REPLY_TTL_S = 600  # a reply nobody collected (the asker gave up) does not stay forever
HEARD_NAME = ".forgets-heard"  # in the worker's directory of kept prompts: the last "n" done

_forgets_in_order = threading.Lock()


def _same(spec: ModelSpec) -> ModelSpec:
    return spec


def run_command(
    host: EngineHost, worker: str, command: dict, resolve: Callable[[ModelSpec], ModelSpec] = _same,
    prompts_dir: str = "",
) -> dict:  # fmt: skip
    """Execute one command on this worker's host; every outcome is an answer, never a raise.
    `resolve`: the spec with this box's own copy of the model (WorkerRuntime.local_spec);
    `prompts_dir`: this worker's directory of kept prompts."""
    op = command.get("op")
    try:
        if op == "load":
            host.load(resolve(ModelSpec.from_wire(command["spec"])))
            result = True
        elif op == "unload":
            name = command.get("name")
            if not isinstance(name, str) or not name:
                raise ValueError("unload needs a model name")
            result = host.unload(name)
        elif op == "forget":
            result = _forget(host, command, resolve, prompts_dir)
        else:
            raise ValueError(f"unknown control operation {op!r}")
    except Exception as exc:  # noqa: BLE001 - a failed load is an answer for the dashboard
        refused = Refused.of(exc, RefusalKind.LOAD_FAILED if op == "load" else RefusalKind.FAILED)
        if refused.kind != RefusalKind.BUSY:
            log.warning("control %s failed on %s: %s", op, worker, exc)
        return {"worker": worker, "ok": False, "error": str(refused.kind),
                "message": refused.message}  # fmt: skip
    return {"worker": worker, "ok": True, "result": result}


def _forget(host: EngineHost, command: dict, resolve, prompts_dir: str) -> int:
    """A forget heard live: done once, in order. One after a gap (a forget this worker missed
    while it listened again) is done at once, and the gap at the next catch-up."""
    n = command.get("n")
    if type(n) is not int or not prompts_dir:
        return _do_forget(host, command, resolve, prompts_dir)
    with _forgets_in_order:
        heard = _heard(prompts_dir)
        if n <= heard:
            return 0  # a catch-up did it already
        done = _do_forget(host, command, resolve, prompts_dir)
        if n == heard + 1:
            _set_heard(prompts_dir, n)
        return done


def catch_up_forgets(
    host: EngineHost, worker: str, client: redis.Redis, resolve=_same, prompts_dir: str = "",
) -> int:  # fmt: skip
    """Do the forgets kept in Redis that this worker has not done (at start, and whenever its
    listener subscribes again), in order; the entries forgotten. When some it missed are no
    longer kept (more than MAX_FORGETS since), everything it keeps is forgotten instead."""
    if not prompts_dir:
        return 0
    with _forgets_in_order:
        heard = _heard(prompts_dir)
        missed = [command for command in keys.kept_forgets(client) if command["n"] > heard]
        if not missed:
            return 0
        done = 0
        if missed[0]["n"] > heard + 1:
            log.warning("%s missed forgets no longer kept: forgetting every kept prompt", worker)
            done += kept_prompts.forget(host, prompts_dir, everything=True).total
        for command in missed:
            try:
                done += _do_forget(host, command, resolve, prompts_dir)
            except (ValueError, TypeError, KeyError) as exc:  # a malformed one: nothing to do
                log.warning("%s skips a malformed forget: %s", worker, exc)
            _set_heard(prompts_dir, command["n"])
        log.info("%s did %d forgets it had missed", worker, len(missed))
        return done


def _heard(prompts_dir: str) -> int:
    try:
        return int((Path(prompts_dir) / HEARD_NAME).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _set_heard(prompts_dir: str, n: int) -> None:
    path = Path(prompts_dir) / HEARD_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(HEARD_NAME + ".new")
    temporary.write_text(str(n))
    os.replace(temporary, path)


def _do_forget(host: EngineHost, command: dict, resolve, prompts_dir: str) -> int:
    partition = command.get("partition")
    if partition is not None and (not isinstance(partition, str) or len(partition) > 128):
        raise ValueError("a partition is a short string")
    everything = command.get("everything") is True
    model = None
    if command.get("spec") is not None:
        try:
            model = resolve(ModelSpec.from_wire(command["spec"]))
        except Refused:  # no copy of the model on this box: only its files could be here
            model = ModelSpec.from_wire(command["spec"])
    return kept_prompts.forget(host, prompts_dir, partition=partition, model=model,
                               everything=everything).total  # fmt: skip


def execute_control(
    host: EngineHost, worker: str, client: redis.Redis, command: dict,
    resolve: Callable[[ModelSpec], ModelSpec] = _same, announce: Callable[[], None] | None = None,
    prompts_dir: str = "",
) -> None:  # fmt: skip
    """Run a command and answer it; `announce` (the worker's) runs before the answer, so the
    router already sees what a load or an unload changed when the asker goes on."""
    reply = command.get("reply")
    # Only reply lists of our own shape: a command must not make a worker write any other key.
    if not isinstance(reply, str) or not reply.startswith(REPLY_PREFIX) or len(reply) > 200:
        log.warning("ignoring a control command without a valid reply key")
        return
    answer = run_command(host, worker, command, resolve, prompts_dir)
    if announce is not None:
        try:
            announce()
        except Exception as exc:  # noqa: BLE001 - the answer matters more
            log.warning("could not announce after control %s: %s", command.get("op"), exc)
    try:
        with client.pipeline() as pipe:
            pipe.rpush(reply, json.dumps(answer))
            pipe.expire(reply, REPLY_TTL_S)
            pipe.execute()
    except redis.RedisError as exc:
        log.warning("could not answer control %s: %s", command.get("op"), exc)
