"""Progress and cancellation of a background job (hashing, downloads), as the dashboard reads it.

A job's row is the only channel between the page and the worker: the page polls it, and a
cancel button sets its state to cancelled. Progress writes are throttled (a 40 GB file hashes in
~10k chunks), and each write doubles as the cancellation check: it only touches a row that is
not cancelled, so a write that changes nothing means somebody cancelled.
"""

import logging
import time

from django.db import OperationalError
from django.utils import timezone

from inference import storable
from inference.models import Job, LLMModel

log = logging.getLogger(__name__)

MiB = 1 << 20


class JobCancelled(Exception):
    """The job's row was set to cancelled while it ran."""


class JobProgress:
    def __init__(self, job_id: int, *, interval: float = 0.25):
        self.job_id = job_id
        self.interval = interval
        self._last_write = 0.0

    def _write(self, **fields) -> None:
        updated = (
            Job.objects.filter(pk=self.job_id)
            .exclude(state=Job.State.CANCELLED)
            .update(updated_at=timezone.now(), **storable.values(Job, **fields))
        )
        if not updated:
            raise JobCancelled(f"job {self.job_id} was cancelled")

    def start(self, message: str) -> None:
        self._write(state=Job.State.RUNNING, message=message)

    def note(self, message: str) -> None:
        """A message that must be seen (a retry, a phase change): written at once."""
        self._write(message=message)
        self._last_write = time.monotonic()

    def update(self, done: int, total: int | None, verb: str = "") -> None:
        """Bytes done of total; written at most every `interval` seconds, and at the end."""
        now = time.monotonic()
        if now - self._last_write < self.interval and done != total:
            return
        self._last_write = now
        fraction = min(1.0, done / total) if total else 0.0
        amount = f"{done / MiB:.1f} of {total / MiB:.1f} MiB" if total else f"{done / MiB:.1f} MiB"
        try:
            self._write(progress=fraction, message=f"{verb} {amount}".strip())
        except OperationalError as exc:  # a busy SQLite: progress is best-effort, the job is not
            log.debug("progress of job %s not written: %s", self.job_id, exc)

    def check(self) -> None:
        """Raise JobCancelled if somebody cancelled, without writing progress."""
        if Job.objects.filter(pk=self.job_id, state=Job.State.CANCELLED).exists():
            raise JobCancelled(f"job {self.job_id} was cancelled")

    def finish(self, message: str, model: LLMModel | None = None) -> None:
        fields = {"state": Job.State.DONE, "progress": 1.0, "message": message}
        if model is not None:
            fields["model"] = model
        self._write(**fields)

    def fail(self, message: str) -> None:
        """Record a failure, unless the job was cancelled (that state and its note stay)."""
        Job.objects.filter(pk=self.job_id).exclude(state=Job.State.CANCELLED).update(
            **storable.values(Job, message=message[:2000]),
            state=Job.State.FAILED, updated_at=timezone.now(),
        )  # fmt: skip


def cancel_job(job: Job) -> bool:
    """Ask a pending or running job to stop; the worker notices at its next progress write."""
    return bool(
        Job.objects.filter(pk=job.pk, state__in=[Job.State.PENDING, Job.State.RUNNING]).update(
            state=Job.State.CANCELLED, message="cancelled", updated_at=timezone.now()
        )
    )


def dismiss_job(job: Job) -> bool:
    """Hide an ended job from the page (a running one must be cancelled first)."""
    ended = [Job.State.DONE, Job.State.FAILED, Job.State.CANCELLED]
    return bool(Job.objects.filter(pk=job.pk, state__in=ended).update(dismissed=True))


def reset_for_retry(job: Job) -> bool:
    """Put a failed or cancelled job back to pending, to run the same job (same row, same
    source) again; False when it had not failed or been cancelled (a double click)."""
    return bool(
        Job.objects.filter(pk=job.pk, state__in=[Job.State.FAILED, Job.State.CANCELLED]).update(
            state=Job.State.PENDING,
            progress=0.0,
            message="waiting to start again",
            dismissed=False,
            updated_at=timezone.now(),
        )
    )
