"""The stored figures of finished requests: saving them, reading the recent ones back for the
dashboard, and pruning them after settings.REQUEST_RETENTION_DAYS.

Synchronous ORM code: async callers go through database_sync_to_async / sync_to_async.
"""

import logging
import threading
import time
from datetime import timedelta
from typing import TYPE_CHECKING

from django.conf import settings
from django.utils import timezone

from inference.models import RequestRecord

if TYPE_CHECKING:
    from inference.engine import GenerationRequest

log = logging.getLogger(__name__)

# In embedded mode nothing runs Celery beat, so saving a record also prunes, at most this often.
PRUNE_EVERY_S = 3600.0
# encode: reading a request's images (inference.engine.vision), before it queues.
PHASES = ("load", "encode", "queue", "prefill", "decode")
_last_prune = 0.0
_prune_lock = threading.Lock()


def record_request(
    *,
    request_id: str,
    model_name: str,
    source: str,
    client: str,
    figures: dict | None,
    outcome: str,
    error: str = "",
    accepted_wall: float | None = None,
    route: dict | None = None,
) -> RequestRecord:
    """Save one request's figures. `accepted_wall` (epoch seconds, the request's) lets the
    dashboard put every request's timeline on one time axis; `route` ({"worker", "reason"},
    split mode's final events carry it) says which inference worker answered and why."""
    figures = dict(figures or {})
    if accepted_wall is not None:
        figures["accepted_wall"] = accepted_wall
    record = RequestRecord.from_figures(
        request_id=request_id,
        model_name=model_name[:100],
        source=source[:16],
        client=client[:100],
        outcome=outcome[:16],
        figures=figures,
        error=error,
        route=route,
    )
    record.save()
    _maybe_prune()
    return record


def record_answer(
    request: "GenerationRequest",
    final: dict | None,
    *,
    source: str,
    client: str,
    left: str = "the listener left before the answer ended",
    counted: dict | None = None,
    extra: dict | None = None,
) -> tuple[str, str, dict]:
    """Save how an answer ended, the same for the chat page and the API: from its final event
    (done or error), or, when its listener left first (None), as cancelled with `left` as the
    reason and the figures `counted` so far. `extra` figures are added either way. Returns
    (outcome, error, figures) as saved."""
    if final is None:
        outcome, error, figures = "cancelled", left, dict(counted or {})
    elif final.get("type") == "done":
        outcome, error = final.get("finish_reason") or "stop", ""
        figures = dict(final.get("figures") or {})
    else:
        outcome = "error"
        error = final.get("message") or "the answer failed"
        figures = dict(final.get("figures") or {})
    figures.update(extra or {})
    record_request(
        request_id=request.request_id, model_name=request.model, source=source, client=client,
        outcome=outcome, figures=figures, error=error, accepted_wall=request.arrived_wall,
        route=(final or {}).get("route"),
    )  # fmt: skip
    return outcome, error, figures


def prune_request_history(now=None) -> int:
    """Delete records older than the retention; returns how many went."""
    cutoff = (now or timezone.now()) - timedelta(days=settings.REQUEST_RETENTION_DAYS)
    deleted, _ = RequestRecord.objects.filter(created_at__lt=cutoff).delete()
    if deleted:
        log.info("pruned %d request records older than %s", deleted, cutoff)
    return deleted


def _maybe_prune() -> None:
    global _last_prune
    with _prune_lock:
        now = time.monotonic()
        if _last_prune and now - _last_prune < PRUNE_EVERY_S:
            return
        _last_prune = now
    try:
        prune_request_history()
    except Exception:  # noqa: BLE001 - pruning is housekeeping; the record is already saved
        log.exception("pruning request history failed")


def recent_requests(limit: int = 50) -> list[dict]:
    """The latest records, newest first, in the shape the dashboard's table and timeline read.

    `start` is the request's acceptance on the wall clock: from the figures when the saver
    gave it, else estimated as the save time minus the request's total time.
    """
    rows = []
    for record in RequestRecord.objects.all()[: max(1, min(limit, 500))]:
        figures = record.figures or {}
        saved = record.created_at.timestamp()
        start = figures.get("accepted_wall") or saved - (record.total_time or 0.0)
        rows.append({
            "id": record.pk,
            "request_id": record.request_id,
            "model": record.model_name,
            "source": record.source,
            "client": record.client,
            "outcome": record.outcome,
            "error": record.error,
            "created_at": record.created_at.isoformat(),
            "start": start,
            "prompt_tokens": record.prompt_tokens,
            "cached_tokens": record.cached_tokens,
            "output_tokens": record.output_tokens,
            "queue_time": record.queue_time,
            "load_time": record.load_time,
            "prefill_time": record.prefill_time,
            "prompt_tps": record.prompt_tps,
            "ttft": record.ttft,
            "decode_tps": record.decode_tps,
            "itl_p50": record.itl_p50,
            "itl_p95": record.itl_p95,
            "itl_p99": record.itl_p99,
            "total_time": record.total_time,
            # Reading its images (its encode phase); None and 0 for a text request.
            "encode_time": figures.get("encode_time"),
            "image_tokens": figures.get("image_tokens") or 0,
            "worker": record.worker,
            "route": record.route,
            "timeline": _timeline(figures.get("timeline")),
        })  # fmt: skip
    return rows


def _timeline(raw) -> list[dict]:
    """Only well-formed phases: the figures JSON is drawn by the browser as given."""
    phases = []
    for item in raw if isinstance(raw, list) else []:
        if not isinstance(item, dict) or item.get("phase") not in PHASES:
            continue
        start, end = item.get("start"), item.get("end")
        if not isinstance(start, int | float) or not isinstance(end, int | float):
            continue
        phase = {"phase": item["phase"], "start": float(start), "end": float(end)}
        if isinstance(item.get("tokens"), int):
            phase["tokens"] = item["tokens"]
        phases.append(phase)
    return phases
