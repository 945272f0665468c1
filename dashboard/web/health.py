"""/healthz: is the appliance usable? For Docker health checks and uptime monitors; no login.

{"web": "ok", "worker": "ok" | "down", "broker": "ok" | "down" | "not used",
 "models": [loaded model names], "unusable_models": [models a runner refuses now],
 "workers": [{"worker": name, "host": its box, "alive": bool, "models": [loaded model names],
              "runners": [RunnerHealth, ...]}], "mode": "embedded" | "split"};
200 when usable, else 503.

"workers" are the inference workers that reported lately (split mode: a fresh snapshot or a
live heartbeat with its announcement; embedded: this process). "alive" is the heartbeat's word
in split mode (a worker whose heartbeat stopped a moment ago still has a fresh snapshot).

A model whose runner is backing off (it crashed repeatedly) or failed to load is listed in
"unusable_models" and its runner row says "usable": false, but the answer stays 200: the other
models still answer, and a Docker health check that restarted the appliance for one model's
crash loop would take them all down with it.
"""

import logging
import socket
import time
from dataclasses import dataclass
from typing import TypedDict

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from dashboard.web.panels import runner_panel
from inference.serving.client import get_client

log = logging.getLogger(__name__)

BROKER_TIMEOUT_S = 2.0
# A split-mode worker publishes a snapshot every TELEMETRY_INTERVAL_S; this many missed in a row
# and it counts as down (and at least a few seconds, for slow intervals and clock skew).
MISSED_SNAPSHOTS = 10
MIN_STALE_S = 5.0
# Runner states (inference.serving.supervisor) in which a request for the model is refused now.
# "crashed" is not one: the next request starts the runner again.
UNUSABLE_STATES = frozenset({"backing off", "failed"})


class RunnerHealth(TypedDict):
    model: str
    state: str
    pid: int | None
    restarts: int
    last_exit: str | None
    retry_in: float | None  # seconds until the supervisor allows a restart (backing off)
    note: str  # the CPU self-check's finding, "" when it changed nothing
    usable: bool


class WorkerHealth(TypedDict):
    worker: str
    host: str
    alive: bool
    models: list[str]  # loaded
    runners: list[RunnerHealth]


@dataclass(frozen=True, slots=True)
class WorkerStatus:
    status: str  # "ok" | "down"
    models: list[str]  # loaded, on any fresh worker
    workers: list[WorkerHealth]  # the fresh workers only: a stale one's runners say nothing now

    @classmethod
    def down(cls) -> "WorkerStatus":
        return cls("down", [], [])

    @property
    def unusable_models(self) -> list[str]:
        """Models a runner refuses on some worker: in split mode any worker may take a request."""
        return sorted({
            r["model"] for w in self.workers for r in w["runners"] if not r["usable"]
        })  # fmt: skip


def broker_status() -> str:
    if get_client().mode != "split":
        return "not used"
    import redis

    try:
        client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=BROKER_TIMEOUT_S,
            socket_connect_timeout=BROKER_TIMEOUT_S,
        )  # fmt: skip
        try:
            client.ping()
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - any failure to reach Redis means "down"
        log.warning("healthz: broker unreachable: %s", exc)
        return "down"
    return "ok"


def runner_health(raw: dict) -> RunnerHealth:
    row = runner_panel(raw, 0.0)  # the dashboard's reading of a runner row, junk tolerated
    retry_in = row["retry_in"]
    return {
        "model": row["model"],
        "state": row["state"],
        "pid": row["pid"],
        "restarts": row["restarts"],
        "last_exit": row["last_exit"],
        "retry_in": round(retry_in, 1) if retry_in is not None else None,
        "note": row["note"],
        "usable": row["state"] not in UNUSABLE_STATES,
    }


def worker_health(snapshot: dict, host: str = "", alive: bool = True) -> WorkerHealth:
    runners = snapshot.get("runners")
    loaded = snapshot.get("loaded")
    return {
        "worker": str(snapshot.get("worker") or ""),
        "host": host,
        "alive": alive,
        "models": sorted(
            str(row["name"]) for row in (loaded if isinstance(loaded, list) else [])
            if isinstance(row, dict) and row.get("name")
        ),
        "runners": sorted(
            (runner_health(r) for r in (runners if isinstance(runners, list) else [])
             if isinstance(r, dict) and isinstance(r.get("model"), str) and r["model"]),
            key=lambda r: r["model"],
        ),
    }  # fmt: skip


def worker_status() -> WorkerStatus:
    """Up or down, the loaded models and the runners, from the workers' latest snapshots and,
    in split mode, their heartbeats and announcements (host, loaded models)."""
    client = get_client()
    try:
        snapshots = client.snapshots()
        split = client.mode == "split"
        announced = {a.worker: a for a in client.announcements()} if split else {}
        live = set(client.live_workers()) if split else set()
    except Exception as exc:  # noqa: BLE001
        log.warning("healthz: no worker snapshot: %s", exc)
        return WorkerStatus.down()
    stale_after = max(MIN_STALE_S, MISSED_SNAPSHOTS * settings.TELEMETRY_INTERVAL_S)
    now = time.time()
    fresh = [s for s in snapshots if now - float(s.get("time") or 0) <= stale_after]
    models = sorted({row["name"] for s in fresh for row in s.get("loaded") or [] if "name" in row})
    workers = []
    for snap in fresh:
        name = str(snap.get("worker") or "")
        if not split:
            workers.append(worker_health(snap, host=socket.gethostname()))
        else:
            box = announced.pop(name, None)
            workers.append(worker_health(snap, host=box.host if box else "", alive=name in live))
    for box in announced.values():  # alive and announced, no snapshot yet (starting)
        loaded = [{"name": m.name} for m in box.loaded]
        workers.append(worker_health({"worker": box.worker, "loaded": loaded}, host=box.host))
        models = sorted({*models, *(m.name for m in box.loaded)})
    workers.sort(key=lambda w: w["worker"])
    return WorkerStatus("ok" if workers else "down", models, workers)


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    broker = broker_status()
    workers = worker_status() if broker != "down" else WorkerStatus.down()
    body = {
        "web": "ok",
        "worker": workers.status,
        "broker": broker,
        "models": workers.models,
        "unusable_models": workers.unusable_models,
        "workers": workers.workers,
        "mode": get_client().mode,
    }
    # Runner states do not enter this: see the module's docstring.
    usable = workers.status == "ok" and broker != "down"
    return JsonResponse(body, status=200 if usable else 503)
