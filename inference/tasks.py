"""Background jobs on queue "jobs": thin wrappers over tested functions, and schedule_hash, which
starts one. This module depends on the ones it wraps, never the other way: a function there
that starts a hash job is passed schedule_hash.

Every task takes ids, is idempotent (a finished job is left alone; a redelivered one resumes),
has a time limit, and retries only named errors with backoff and a cap. In embedded mode
inference.dispatch calls them directly on a thread; the functions they wrap record their own
progress and failures on the Job row. A download's network retries (with Range resume) happen
inside inference.downloads, so both modes retry the same way.
"""

from django.db import OperationalError

from appliance.celery import app
from inference import downloads, importing
from inference.dispatch import dispatch
from inference.models import Job, LLMModel

HOUR = 3600
# A database that is briefly locked or unreachable is worth waiting for; nothing else is.
DB_RETRY = dict(
    autoretry_for=(OperationalError,), retry_backoff=2, retry_backoff_max=120, max_retries=5,
    retry_jitter=True,
)  # fmt: skip


@app.task(name="inference.hash_model", soft_time_limit=6 * HOUR, time_limit=6 * HOUR + 60,
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
@app.task(name="inference.download_model", soft_time_limit=24 * HOUR, time_limit=24 * HOUR + 60,
          **DB_RETRY)  # fmt: skip
def download_model(job_id: int) -> int | None:
    model = downloads.download_model(job_id)
    return model.pk if model else None


@app.task(name="inference.scan_models_dir", soft_time_limit=600, time_limit=660, **DB_RETRY)
def scan_models_dir() -> list[str]:
    return [model.name for model in importing.scan_models_dir(schedule_hash)]


@app.task(name="inference.prune_request_history", soft_time_limit=600, time_limit=660, **DB_RETRY)
def prune_request_history() -> int:
    from inference.history import prune_request_history as prune  # another module's: lazily

    return prune()


@app.task(name="inference.unload_idle_models", soft_time_limit=60, time_limit=90)
def unload_idle_models() -> list[str]:
    from inference.registry import unload_idle_models as unload

    return unload()
