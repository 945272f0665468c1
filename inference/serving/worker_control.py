"""Load and unload commands that reach the inference workers over Redis pub/sub.

Command (JSON on appliance:control); one with "worker": <name> is for that worker only:
    {"op": "load", "spec": ModelSpec.to_wire(), "reply": "appliance:control:reply:<hex>",
     "worker": <the router's choice>}
    {"op": "unload", "name": "<model>", "reply": ...}
    {"op": "forget", "partition": str | null, "spec": ModelSpec.to_wire() | null,
     "everything": bool, "reply": ...}   (kept prompts: inference.serving.kept_prompts)
Each worker RPUSHes one answer onto the reply list:
    {"worker": name, "ok": true, "result": <bool for unload, true for load>}
    {"worker": name, "ok": false, "error": <a RefusalKind>, "message": str}
"""

import json
import logging
from collections.abc import Callable

import redis

from inference.engine.host import EngineHost, ModelSpec
from inference.engine.refusals import RefusalKind, Refused
from inference.serving import kept_prompts
from inference.serving import split_protocol as keys

log = logging.getLogger(__name__)

REPLY_PREFIX = f"{keys.PREFIX}:control:reply:"
REPLY_TTL_S = 600  # a reply nobody collected (the asker gave up) does not stay forever


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
