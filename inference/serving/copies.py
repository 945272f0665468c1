"""Copying a model to a box (split mode): what the web side and an inference worker agree on.

The staff's "copy to box X" on a model's page (dashboard.model_pages.copy_to_box):
1. The web side puts a one-time token in Redis, bound to the model's sha256 and to worker X,
   for COPY_TOKEN_TTL_S, and sends task "inference.copy_model" with a CopyJob to X's own queue
   (split_protocol.worker_queue).
2. Worker X fetches the file from the web box (GET CopyJob.url with the token as a Bearer
   credential and its own name in WORKER_HEADER) through the download guard, its progress in
   Redis as a CopyStatus (inference.serving.copy_worker).
3. The web side serves the bytes only to a token it issued: `redeem` takes it out of Redis as
   it reads it, so it serves one transfer, and a missing, spent or expired token is a 403.
4. The model's page reads the CopyStatus of each worker (`statuses`) as the copy runs.

    appliance:copy:token:<sha256 of the token>  CopyGrant as JSON, TTL COPY_TOKEN_TTL_S
    appliance:copy:status:<model sha256>        hash: worker -> CopyStatus as JSON,
                                                TTL COPY_STATUS_TTL_S from its last change

Only a digest of the token is a Redis key: whoever can read Redis's keys learns no token.
"""

import hashlib
import json
import secrets
import time
from dataclasses import asdict, dataclass, replace
from typing import Literal

import redis

from inference.serving.split_protocol import PREFIX, worker_queue

COPY_TASK = "inference.copy_model"
COPY_TOKEN_TTL_S = 300  # the worker starts the transfer within this; the task waits in its queue
COPY_STATUS_TTL_S = 24 * 3600
WORKER_HEADER = "X-Appliance-Worker"
TOKEN_BYTES = 32
# Publishing a copy task: a few quick tries, then the page says it failed.
PUBLISH_RETRY = {"max_retries": 2, "interval_start": 0, "interval_step": 0.5, "interval_max": 1}

CopyState = Literal["queued", "copying", "done", "failed"]
COPY_STATES: tuple[CopyState, ...] = ("queued", "copying", "done", "failed")


def _token_key(token: str) -> str:
    return f"{PREFIX}:copy:token:{hashlib.sha256(token.encode()).hexdigest()}"


def status_key(sha256: str) -> str:
    return f"{PREFIX}:copy:status:{sha256}"


@dataclass(frozen=True, slots=True)
class CopyGrant:
    """What a token allows: the bytes of one file, to one worker."""

    sha256: str
    worker: str


@dataclass(frozen=True, slots=True)
class CopyJob:
    """The task payload: which file to fetch, from where, with which token."""

    model: str  # the name on the web side, for messages
    sha256: str
    size_bytes: int
    filename: str  # the file's name on the web box; the worker keeps it where it is free
    url: str  # the web box's file endpoint for this sha256
    token: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: object) -> "CopyJob":
        if not isinstance(raw, dict):
            raise ValueError("a copy job must be an object")
        job = cls(**{field: raw.get(field) for field in cls.__dataclass_fields__})
        for field in ("model", "sha256", "filename", "url", "token"):
            if not isinstance(getattr(job, field), str) or not getattr(job, field):
                raise ValueError(f"a copy job needs {field}")
        if not isinstance(job.size_bytes, int) or isinstance(job.size_bytes, bool):
            raise ValueError("a copy job needs size_bytes")
        return job


@dataclass(frozen=True, slots=True)
class CopyStatus:
    """One worker's copy of one file, as the model's page shows it."""

    worker: str
    state: CopyState
    done_bytes: int
    total_bytes: int
    message: str
    time: float  # when it was written (epoch seconds)

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")

    def under_way(self, now: float) -> bool:
        """Queued or copying, and heard of lately: a copy whose worker died says "copying"
        until its status expires, but after COPY_TOKEN_TTL_S of silence nothing can come of it
        (a queued task's token has expired; a running copy writes progress every second)."""
        return not self.finished and now - self.time < COPY_TOKEN_TTL_S

    @classmethod
    def from_json(cls, text: str) -> "CopyStatus":
        raw = json.loads(text)
        if not isinstance(raw, dict) or raw.get("state") not in COPY_STATES:
            raise ValueError("not a copy status")
        return cls(
            worker=str(raw.get("worker") or ""), state=raw["state"],
            done_bytes=int(raw.get("done_bytes") or 0),
            total_bytes=int(raw.get("total_bytes") or 0),
            message=str(raw.get("message") or ""), time=float(raw.get("time") or 0.0),
        )  # fmt: skip


def issue_token(client: redis.Redis, grant: CopyGrant) -> str:
    """A new one-time token for `grant`, valid COPY_TOKEN_TTL_S."""
    token = secrets.token_urlsafe(TOKEN_BYTES)
    client.set(_token_key(token), json.dumps(asdict(grant)), ex=COPY_TOKEN_TTL_S)
    return token


def redeem(client: redis.Redis, token: str) -> CopyGrant | None:
    """The grant of `token`, taken out of Redis as it is read (GETDEL: two requests with one
    token cannot both have it); None for a token that is unknown, spent or expired."""
    if not token or len(token) > 200:
        return None
    raw = client.getdel(_token_key(token))
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        return CopyGrant(sha256=str(data["sha256"]), worker=str(data["worker"]))
    except (ValueError, KeyError, TypeError):
        return None


def write_status(
    client: redis.Redis, sha256: str, worker: str, state: CopyState, *,
    done: int = 0, total: int = 0, message: str = "",
) -> CopyStatus:  # fmt: skip
    status = CopyStatus(worker, state, done, total, message[:2000], time.time())
    key = status_key(sha256)
    with client.pipeline() as pipe:
        pipe.hset(key, worker, json.dumps(asdict(status)))
        pipe.expire(key, COPY_STATUS_TTL_S)
        pipe.execute()
    return status


def statuses(client: redis.Redis, sha256: str) -> dict[str, CopyStatus]:
    """Worker name -> its latest copy of this file (garbled entries left out)."""
    found = {}
    for worker, raw in client.hgetall(status_key(sha256)).items():
        try:
            found[str(worker)] = CopyStatus.from_json(raw)
        except (ValueError, TypeError):
            continue
    return found


@dataclass(frozen=True, slots=True)
class ModelCopies:
    """The web side's part in copying a model to a box, as the inference client offers it
    (InferenceClient.copies: split mode's client has one, the embedded one None): the model's
    page asks the client, never the mode or its Redis."""

    client: redis.Redis

    def statuses(self, sha256: str) -> dict[str, CopyStatus]:
        return statuses(self.client, sha256)

    def start(self, job: CopyJob, worker: str, *, message: str) -> CopyStatus:
        """Step 1: a token for (the job's sha256, `worker`) in the job, its status "queued", and
        task COPY_TASK on the worker's own queue."""
        from celery import current_app  # the app of this process (appliance.celery), unnamed

        job = replace(job, token=issue_token(self.client, CopyGrant(job.sha256, worker)))
        status = write_status(self.client, job.sha256, worker, "queued", total=job.size_bytes,
                              message=message)  # fmt: skip
        current_app.send_task(COPY_TASK, args=[job.to_dict()], queue=worker_queue(worker),
                              retry=True, retry_policy=PUBLISH_RETRY,
                              ignore_result=True)  # fmt: skip
        return status

    def redeem(self, token: str) -> CopyGrant | None:
        return redeem(self.client, token)
