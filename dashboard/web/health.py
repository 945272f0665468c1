"""/healthz: is the appliance usable? For Docker health checks and uptime monitors; no login.

{"web": "ok", "worker": "ok" | "down", "broker": "ok" | "down" | "not used",
 "models": [loaded model names], "mode": "embedded" | "split"}; 200 when usable, else 503.
"""

import logging
import time

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from inference.client import get_client

log = logging.getLogger(__name__)

BROKER_TIMEOUT_S = 2.0
# A split-mode worker publishes a snapshot every TELEMETRY_INTERVAL_S; this many missed in a row
# and it counts as down (and at least a few seconds, for slow intervals and clock skew).
MISSED_SNAPSHOTS = 10
MIN_STALE_S = 5.0


def broker_status() -> str:
    if not settings.SPLIT_MODE:
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


def worker_status() -> tuple[str, list[str]]:
    """("ok" | "down", loaded model names) from the workers' latest snapshots."""
    try:
        snapshots = get_client().snapshots()
    except Exception as exc:  # noqa: BLE001
        log.warning("healthz: no worker snapshot: %s", exc)
        return "down", []
    stale_after = max(MIN_STALE_S, MISSED_SNAPSHOTS * settings.TELEMETRY_INTERVAL_S)
    now = time.time()
    fresh = [s for s in snapshots if now - float(s.get("time") or 0) <= stale_after]
    models = sorted({row["name"] for s in fresh for row in s.get("loaded") or [] if "name" in row})
    return ("ok" if fresh else "down"), models


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    broker = broker_status()
    worker, models = worker_status() if broker != "down" else ("down", [])
    body = {
        "web": "ok",
        "worker": worker,
        "broker": broker,
        "models": models,
        "mode": "split" if settings.SPLIT_MODE else "embedded",
    }
    usable = worker == "ok" and broker != "down"
    return JsonResponse(body, status=200 if usable else 503)
