"""Background jobs on queue "jobs": thin wrappers over tested functions, and schedule_hash, which
starts one. This module depends on the ones it wraps, never the other way: a function there
that starts a hash job is passed schedule_hash.

Every task takes ids, is idempotent (a finished job is left alone; a redelivered one resumes),
has a time limit, and retries only named errors with backoff and a cap. In embedded mode
inference.jobs.dispatch calls them directly on a thread; the functions they wrap record their own
progress and failures on the Job row. A download's network retries (with Range resume) happen
inside inference.catalog.downloads, so both modes retry the same way.
"""

import logging
import threading

from celery import shared_task
from django.conf import settings
from django.db import OperationalError, close_old_connections

from inference.catalog import blobs, downloads, importing
from inference.catalog.pulling import pull
from inference.jobs import progress
from inference.jobs.dispatch import dispatch
from inference.models import Job, LLMModel

log = logging.getLogger(__name__)

HOUR = 3600
# A database that is briefly locked or unreachable is worth waiting for; nothing else is.
DB_RETRY = dict(
    autoretry_for=(OperationalError,), retry_backoff=2, retry_backoff_max=120, max_retries=5,
    retry_jitter=True,
)  # fmt: skip


@shared_task(name="inference.hash_model", soft_time_limit=6 * HOUR, time_limit=6 * HOUR + 60,
             **DB_RETRY)  # fmt: skip
def hash_model(job_id: int) -> str | None:
    return importing.hash_model_job(job_id)


def schedule_hash(model: LLMModel) -> Job:
    """A job that hashes the model's file, with progress (run after the transaction commits)."""
    job = Job.objects.create(
        kind=Job.Kind.HASH, model=model, source=model.file_path, message="waiting to hash"
    )
    dispatch(hash_model, job.id)
    return job


# Under the broker's visibility timeout (1 h) would cut large downloads short; the job resumes
# from its partial file if it is redelivered anyway.
@shared_task(name="inference.download_model", soft_time_limit=24 * HOUR,
             time_limit=24 * HOUR + 60, **DB_RETRY)  # fmt: skip
def download_model(job_id: int) -> int | None:
    model = downloads.download_model(job_id)
    return model.pk if model else None


# Like a download: long, and resumed from its partial file if it is redelivered.
@shared_task(name="inference.pull_model", soft_time_limit=24 * HOUR,
             time_limit=24 * HOUR + 60, **DB_RETRY)  # fmt: skip
def pull_model(job_id: int) -> int | None:
    model = pull.pull_model(job_id)
    return model.pk if model else None


def schedule_pull(name: str, *, insecure: bool = False) -> Job:
    """The job that pulls `name` (its display form, inference.catalog.pulling.names), or the one
    already pulling it: a second pull of a name follows the first."""
    running = pull.active_pull(name)
    if running is not None:
        return running
    job = Job.objects.create(kind=Job.Kind.PULL, source=name, message="waiting to start",
                             detail={"insecure": insecure})  # fmt: skip
    dispatch(pull_model, job.id)
    return job


# The jobs that Retry runs again, by kind: each task takes the job's id and resumes it from its
# row (a download or a pull from its partial file). Uploads cannot be retried: their bytes came
# from a browser.
RETRY_TASKS = {
    Job.Kind.HASH: hash_model, Job.Kind.DOWNLOAD: download_model, Job.Kind.PULL: pull_model,
}  # fmt: skip


def retry(job: Job) -> bool:
    """Run a failed or cancelled job again; False when its kind cannot be retried, it had not
    failed, or (a hash) its model is gone."""
    task = RETRY_TASKS.get(job.kind)
    if task is None or (job.kind == Job.Kind.HASH and job.model_id is None):
        return False
    if not progress.reset_for_retry(job):
        return False
    dispatch(task, job.id)
    return True


@shared_task(name="inference.scan_models_dir", soft_time_limit=600, time_limit=660, **DB_RETRY)
def scan_models_dir() -> list[str]:
    return [model.name for model in importing.scan_models_dir(schedule_hash)]


@shared_task(name="inference.prune_request_history", soft_time_limit=600, time_limit=660,
             **DB_RETRY)  # fmt: skip
def prune_request_history() -> int:
    from inference.history import prune_request_history as prune  # another module's: lazily

    return prune()


@shared_task(name="inference.prune_blobs", soft_time_limit=600, time_limit=660, **DB_RETRY)
def prune_blobs() -> list[str]:
    return blobs.prune().removed


_blob_timer: threading.Timer | None = None
_blob_timer_lock = threading.Lock()


def keep_blobs_pruned() -> None:
    """Prune the blobs now, and (embedded mode, which has no beat) again when the next one left
    is due, on a timer thread of this process; called at start and after each upload. In split
    mode the beat runs prune_blobs every hour. One timer at a time: a later call replaces it."""
    global _blob_timer
    if settings.SPLIT_MODE:
        return
    try:
        due = blobs.prune().next_in
    except Exception:  # noqa: BLE001 - housekeeping: a failure must not fail the upload
        log.exception("pruning unused blobs failed")
        return
    with _blob_timer_lock:
        if _blob_timer is not None:
            _blob_timer.cancel()
        _blob_timer = None
        if due is not None:
            _blob_timer = threading.Timer(due + 1, _prune_blobs_on_timer)
            _blob_timer.daemon = True
            _blob_timer.start()


def _prune_blobs_on_timer() -> None:
    try:
        keep_blobs_pruned()
    finally:
        close_old_connections()  # a thread of its own: its database connection goes with it


@shared_task(name="inference.unload_idle_models", soft_time_limit=60, time_limit=90)
def unload_idle_models() -> list[str]:
    from inference.catalog.operations import unload_idle_models as unload

    return unload()
