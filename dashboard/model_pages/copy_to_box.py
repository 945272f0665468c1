"""The boxes on a model's page, and "copy to box X" (split mode; the protocol is
inference.serving.copies, which the inference client offers as `copies`, None with one box).

- `boxes_for(model)`: each live inference worker, whether it has the model's file (its
  announcement lists the file's sha256), whether it has it loaded, and its latest copy of it.
- POST /models/<name>/copy/ (staff): a one-time token in Redis for (sha256, worker), then task
  "inference.copy_model" on that worker's own queue. The worker fetches the file from
  `web_url(request)`: WEB_URL when set, else the address the staff's browser used.
- GET /models/<name>/boxes/: `boxes_for` as JSON, which the page polls while a copy runs.
- GET /models/files/<sha256>/: the file's bytes, only to the bearer of a token issued for that
  sha256 and the worker it names (redeemed as it is read: one transfer per token); 403 without
  one. No login: a worker has no session. It passes the gate untouched (not an API path).
"""

import logging
import os
import time
from typing import TypedDict

import redis
from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect
from django.urls import reverse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET, require_POST

from dashboard.model_pages.display import bytes_label
from dashboard.web.security import staff_required
from inference.catalog.blobs import projector_with
from inference.models import LLMModel
from inference.serving import copies
from inference.serving.announcement import WorkerAnnouncement
from inference.serving.client import get_client

log = logging.getLogger(__name__)

FILE_BLOCK_BYTES = 1 << 20


class CopyRefused(Exception):
    """A copy that cannot start; the message says why."""


class BoxView(TypedDict):
    worker: str
    host: str
    has_file: bool
    loaded: bool
    copy: dict | None  # its latest CopyStatus of this file, worded; None: never copied
    can_copy: bool  # no file, no copy under way


def other_boxes() -> bool:
    """Whether the inference client can copy a model to another box (split mode's can)."""
    return get_client().copies is not None


def announcements() -> list[WorkerAnnouncement]:
    """The live workers' announcements; none when embedded, or when Redis does not answer
    (the page still renders; a copy then says no worker is running)."""
    try:
        return get_client().announcements()
    except redis.RedisError as exc:
        log.warning("cannot read the workers' announcements: %s", exc)
        return []


def copy_view(status: copies.CopyStatus) -> dict:
    total = status.total_bytes
    return {
        "state": status.state,
        "message": status.message,
        "fraction": min(1.0, status.done_bytes / total) if total else 0.0,
        "size": bytes_label(total),
        "finished": status.finished,
    }


def boxes_for(model: LLMModel) -> list[BoxView]:
    """The live inference workers as this model's page shows them (split mode; [] embedded)."""
    weights = model.weights
    sha = weights.sha256
    found = announcements()
    desk = get_client().copies
    statuses = desk.statuses(sha) if desk is not None and sha and found else {}
    projector = weights.projector
    rows: list[BoxView] = []
    for box in sorted(found, key=lambda a: a.worker):
        # A vision model's files are two: the box has it when it has both.
        has_file = bool(sha) and box.serves_sha(sha) and (
            projector is None or box.serves_sha(projector.sha256))
        status = statuses.get(box.worker)
        running = status is not None and status.under_way(time.time())
        rows.append({
            "worker": box.worker,
            "host": box.host,
            "has_file": has_file,
            "loaded": box.loaded_sha(sha) is not None,
            "copy": copy_view(status) if status is not None else None,
            "can_copy": bool(sha) and not has_file and not running,
        })  # fmt: skip
    return rows


def web_url(request: HttpRequest) -> str:
    """Where the boxes reach this web box: WEB_URL, else the address the browser used."""
    return settings.WEB_URL or request.build_absolute_uri("/").rstrip("/")


def start_copy(model: LLMModel, worker: str, base_url: str) -> copies.CopyStatus:
    """Tell `worker` to fetch `model`'s file from `base_url`; its queued CopyStatus."""
    desk = get_client().copies
    if desk is None:
        raise CopyRefused("copying to another box needs split mode (REDIS_URL): this "
                          "appliance is one box")  # fmt: skip
    weights = model.weights
    if not weights.sha256:
        raise CopyRefused(f"{model.name} has not been hashed yet; copy it when its sha256 "
                          "is known")  # fmt: skip
    if not os.path.isfile(weights.file_path):
        raise CopyRefused(f"the file of {model.name} is missing on this box")
    box = next((a for a in announcements() if a.worker == worker), None)
    if box is None:
        raise CopyRefused(f"no inference worker named {worker} is running")
    # A vision model's projector travels beside its file, as a copy of its own.
    projector = weights.projector
    files = [(weights.sha256, weights.size_bytes, weights.file_path)]
    if projector is not None and projector.sha256:
        files.append((projector.sha256, projector.size_bytes, projector.file_path))
    missing = [file for file in files if not box.serves_sha(file[0])]
    if not missing:
        raise CopyRefused(f"{worker} has {model.name}'s file{'s' if len(files) > 1 else ''} "
                          "already")  # fmt: skip
    earlier = desk.statuses(weights.sha256).get(worker)
    if earlier is not None and earlier.under_way(time.time()):
        raise CopyRefused(f"a copy of {model.name} to {worker} is under way")
    started = []
    for sha256, size, path in missing:
        url = base_url + reverse("model-file", args=[sha256])
        job = copies.CopyJob(model=model.name, sha256=sha256, size_bytes=size,
                             filename=os.path.basename(path), url=url, token="")  # fmt: skip
        started.append(desk.start(job, worker, message=f"waiting for {worker}"))
        log.info("%s: copying %s to %s from %s", model.name, sha256[:12], worker, url)
    return started[0]


@staff_required
@require_POST
def copy_to_box(request: HttpRequest, name: str) -> HttpResponse:
    model = get_object_or_404(LLMModel, name=name)
    worker = request.POST.get("worker", "").strip()
    try:
        start_copy(model, worker, web_url(request))
    except CopyRefused as exc:
        if "application/json" in request.headers.get("Accept", ""):
            return JsonResponse({"error": str(exc)}, status=409)
        messages.error(request, f"{model.name} was not copied: {exc}.")
    else:
        if "application/json" in request.headers.get("Accept", ""):
            return JsonResponse({"boxes": boxes_for(model)}, status=202)
        messages.success(request, f"{worker} is fetching {model.name} from this box.")
    return redirect("model-detail", name=model.name)


@never_cache
@login_required
@require_GET
def boxes(request: HttpRequest, name: str) -> JsonResponse:
    return JsonResponse({"boxes": boxes_for(get_object_or_404(LLMModel, name=name))})


def _forbidden(reason: str) -> JsonResponse:
    return JsonResponse({"error": reason}, status=403)


@never_cache
@require_GET
def model_file(request: HttpRequest, sha256: str) -> HttpResponse:
    """The bytes of the file with this sha256, to the worker a token was issued for."""
    scheme, _, token = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        return _forbidden("a copy token is required")
    desk = get_client().copies
    if desk is None:
        return _forbidden("the copy token is not valid")  # nothing issues one
    grant = desk.redeem(token.strip())
    worker = request.headers.get(copies.WORKER_HEADER, "")
    if grant is None or grant.sha256 != sha256 or grant.worker != worker:
        log.warning("refused a model file request for %s from %s (worker %r): no valid token",
                    sha256[:12], request.META.get("REMOTE_ADDR"), worker)  # fmt: skip
        return _forbidden("the copy token is not valid: it is unknown, spent or expired")
    model = next(
        (m for m in LLMModel.objects.filter(sha256=sha256, base__isnull=True)
         if os.path.isfile(m.file_path)),
        None,
    )  # fmt: skip
    path = model.file_path if model is not None else None
    if path is None and (projector := projector_with(f"sha256:{sha256}")) is not None:
        path = projector.file_path  # a vision model's projector, copied beside it
    if path is None:
        return JsonResponse({"error": "no model file with this sha256 on this box"}, status=404)
    log.info("sending %s to %s", os.path.basename(path), worker)
    response = FileResponse(open(path, "rb"), content_type="application/octet-stream")
    response["Content-Length"] = str(os.path.getsize(path))
    # Under ASGI each block crosses to a thread and back: Django's 4 KiB blocks would make a
    # 10 GB model millions of hops.
    response.block_size = FILE_BLOCK_BYTES
    return response
