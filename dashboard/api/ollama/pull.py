"""POST /api/pull: pull a model by name as Ollama does, its progress streamed as NDJSON lines.

The pull is a job (inference.catalog.pulling.pull: the jobs queue in split mode, a thread when
embedded). This view starts it, or finds the one already pulling that name, and follows the
job's row, turning its phase and layer bytes into Ollama's lines: `pulling manifest`,
`pulling <digest>` with `total` and `completed`, `verifying sha256 digest`, `writing
manifest`, `success`, or `{"error": ...}` when it fails. A client that leaves stops only its
own following: the job goes on to the end (a model half pulled is worth finishing, and the
next pull of the name would resume it anyway); the models page shows it and can cancel it.

`stream: false` answers once the job has ended: {"status": "success"}, or the error with the
HTTP status the job gave it (404 for a name the registry does not have). A bad name is a 400
before any job starts. Pulling needs an admin key, as deleting does.
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from datetime import timedelta

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils import timezone

from dashboard.api.auth import api_endpoint
from dashboard.api.bodies import parse_body
from dashboard.api.errors import ApiError
from dashboard.api.ollama.schemas import OllamaPullRequest
from dashboard.api.streaming import ndjson, stream_response
from dashboard.models import ApiKey
from inference.catalog.importing import STALE_JOB_S
from inference.catalog.pulling.names import InvalidName, parse
from inference.catalog.pulling.pull import PHASES
from inference.jobs.tasks import schedule_pull
from inference.models import Job

log = logging.getLogger(__name__)

POLL_S = 0.25
HEARTBEAT_S = 10.0  # a line at least this often, so a proxy or a client never sees it idle
PHASE_STATUS = {
    "manifest": "pulling manifest",
    "verifying": "verifying sha256 digest",
    "writing": "writing manifest",
}
ENDED = (Job.State.DONE, Job.State.FAILED, Job.State.CANCELLED)


class Follower:
    """Successive reads of a pull job's row → Ollama's progress lines, each said once and in
    order (a poll that missed a short phase still says it). After an error line, `status` is
    the HTTP status for it."""

    def __init__(self):
        self.phase = -1
        self.layers: dict[tuple[str, str], int] = {}
        self.last: dict | None = None
        self.status = 200

    def lines(self, job: Job) -> list[dict]:
        detail = job.detail or {}
        done = job.state == Job.State.DONE
        phase = PHASES.index(detail["phase"]) if detail.get("phase") in PHASES else 0
        out = []
        if self.phase < 0:
            out.append({"status": PHASE_STATUS["manifest"]})
            self.phase = 0
        for layer in detail.get("layers") or []:
            completed = layer["completed"]
            if done and layer.get("total"):
                completed = layer["total"]
            key = (layer["digest"], layer.get("label", ""))
            if self.layers.get(key) != completed:
                self.layers[key] = completed
                out.append(_layer_line(layer, completed))
        reached = len(PHASES) - 1 if done else phase
        for index in range(self.phase + 1, reached + 1):
            if PHASES[index] in PHASE_STATUS:
                out.append({"status": PHASE_STATUS[PHASES[index]]})
            self.phase = index
        if done:
            out.append({"status": "success"})
        elif job.state == Job.State.FAILED:
            self.status = int(detail.get("error_status") or 500)
            out.append({"error": job.message or "the pull failed"})
        elif job.state == Job.State.CANCELLED:
            self.status = 409
            out.append({"error": "the pull was cancelled"})
        if out:
            self.last = out[-1]
        return out


def _layer_line(layer: dict, completed: int) -> dict:
    digest = layer["digest"]
    line = {"status": f"pulling {digest[7:19] if digest else layer.get('label', '')}"}
    if digest:
        line["digest"] = digest
    if layer.get("total") is not None:
        line["total"] = layer["total"]
    line["completed"] = completed
    return line


def _read(job_id: int) -> Job | None:
    return Job.objects.filter(pk=job_id).first()


async def follow(job_id: int, follower: Follower) -> AsyncIterator[dict]:
    """The job's progress lines until it ends (or stops reporting)."""
    said = time.monotonic()
    while True:
        job = await sync_to_async(_read)(job_id)
        if job is None:
            follower.status = 500
            yield {"error": "the pull job was removed"}
            return
        lines = follower.lines(job)
        for line in lines:
            yield line
        if lines:
            said = time.monotonic()
        if job.state in ENDED:
            return
        if timezone.now() - job.updated_at > timedelta(seconds=STALE_JOB_S):
            follower.status = 500
            yield {"error": "the pull job stopped reporting progress; see the models page"}
            return
        if time.monotonic() - said > HEARTBEAT_S and follower.last is not None:
            yield follower.last  # the same progress again: still working
            said = time.monotonic()
        await asyncio.sleep(POLL_S)


@api_endpoint(dialect="ollama", methods=("POST",), scope=ApiKey.Scope.ADMIN)
async def pull(request: HttpRequest) -> HttpResponse:
    body = parse_body(request, OllamaPullRequest)
    if not body.target:
        raise ApiError(400, "model is required", param="model")
    try:
        name = parse(body.target)
    except InvalidName as exc:
        raise ApiError(400, str(exc), param="model") from None
    job = await sync_to_async(schedule_pull)(name.display, insecure=body.insecure)
    log.info("pull of %s (job %s) through the API, key %s", name.display, job.id,
             request.api_key.name)  # fmt: skip
    follower = Follower()
    if body.stream:
        lines = (ndjson(line) async for line in follow(job.id, follower))
        return stream_response(lines, "application/x-ndjson")
    final: dict = {}
    async for line in follow(job.id, follower):
        final = line
    if "error" in final:
        raise ApiError(follower.status, final["error"])
    return JsonResponse({"status": "success"})
