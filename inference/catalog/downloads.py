"""Downloading a GGUF file from a URL on the LAN: streamed, resumable, validated, then registered.

1. The bytes go to a hidden partial file in MODELS_DIR (`.download-<job>.part`), hashed as they
   arrive. A dropped connection or a 5xx is retried with exponential backoff, resuming with an
   HTTP Range request from the partial file's length (a server that ignores Range starts over).
2. The first bytes must be the GGUF magic, so a web page or an error document is refused at
   once rather than after gigabytes.
3. The complete file is read with the validating GGUF reader, moved into place with one rename
   (same directory, atomic), and registered with the hash computed on the way.
On failure or cancellation the partial file is removed and nothing is registered.

The fetching itself (the guard, the retries, the GGUF magic) is inference.catalog.fetching's.
"""

import logging
from pathlib import Path
from urllib.parse import unquote, urlsplit

from django.conf import settings

from inference.catalog import netguard
from inference.catalog.fetching import (
    ATTEMPTS,
    BACKOFF_S,
    RETRIED,
    DownloadError,
    describe,
    fetch_with_retries,
)
from inference.catalog.importing import (
    AlreadyRegistered,
    ImportRefused,
    install_file,
    safe_filename,
)
from inference.catalog.netguard import AddressRefused, DownloadPolicy, redact_url
from inference.gguf import GGUFError
from inference.jobs import plain
from inference.jobs.progress import JobCancelled, JobProgress
from inference.models import Job, LLMModel

log = logging.getLogger(__name__)


def filename_for(url: str) -> str:
    return safe_filename(unquote(urlsplit(url).path.rsplit("/", 1)[-1]) or "model.gguf")


def part_path(job_id: int) -> Path:
    return Path(settings.MODELS_DIR).resolve() / f".download-{job_id}.part"


def download_model(
    job_id: int,
    *,
    attempts: int = ATTEMPTS,
    backoff: float = BACKOFF_S,
    policy: DownloadPolicy | None = None,
) -> LLMModel | None:
    """Run a download job to the end: the registered model, or None (failed or cancelled;
    the job's row says which and why). Idempotent: a finished job is left alone, and a job
    redelivered after a worker died resumes from its partial file. `policy` is where it may
    connect, by default the settings' (netguard.settings_policy)."""
    job = Job.objects.filter(pk=job_id).first()
    if job is None:
        return None
    part = part_path(job_id)
    if job.state != Job.State.PENDING and job.state != Job.State.RUNNING:
        part.unlink(missing_ok=True)
        return job.model
    progress = JobProgress(job_id)
    try:
        progress.start("connecting")
        policy = policy or netguard.settings_policy()
        digest = fetch_with_retries(job.source, part, progress, attempts, backoff, policy)
        progress.check()
        model = install_file(part, filename_for(job.source), source=LLMModel.Source.URL,
                             sha256=digest)  # fmt: skip
        progress.finish(f"registered as {model.name}", model=model)
        return model
    except JobCancelled:
        log.info("download %s cancelled", job_id)
        return None
    except AlreadyRegistered as exc:  # the same bytes are a model already: point at it
        progress.finish(str(exc), model=exc.model)
        return exc.model
    except (AddressRefused, DownloadError, GGUFError, ImportRefused, ValueError, OSError,
            *RETRIED) as exc:  # fmt: skip
        log.warning("download %s from %s failed: %s", job_id, redact_url(job.source),
                    describe(exc))  # fmt: skip
        progress.fail(plain.message(exc) if isinstance(exc, GGUFError) else describe(exc))
        return None
    except Exception as exc:  # a time limit or a bug: still a failed job, never "running" forever
        progress.fail(f"the download stopped: {describe(exc)}")
        raise
    finally:
        part.unlink(missing_ok=True)  # installed (renamed away), or given up: never left behind
