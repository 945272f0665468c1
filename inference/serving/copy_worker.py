"""An inference worker fetches a model's file from the web box (task "inference.copy_model",
inference.serving.copies has the protocol). No database: the file only has to land in this
box's MODELS_DIR, where the worker's model index finds it by its sha256.

1. The bytes stream to a hidden partial file in MODELS_DIR (`.copy-<sha256>.part`, which the
   model index and the directory scan leave alone) through the download guard
   (inference.catalog.fetching.fetch_with_retries): the guard stays as it is, except that the web
   box's own address and port are trusted for this transfer only (a loopback or private web
   box included), and a redirect elsewhere is judged like any download's.
2. The sha256 is computed as the bytes arrive; more bytes than the file has stop the transfer
   at once, and a digest that is not the model's refuses the copy.
3. The complete file is read with the validating GGUF reader, like every model, and renamed
   into place under a free name (same directory: atomic).
The partial file is removed however it ends. Progress and the result go to Redis as the
worker's CopyStatus, which the model's page reads.
"""

import logging
import os
import time
from pathlib import Path
from urllib.parse import urlsplit

import redis
from django.conf import settings

from inference.catalog import netguard
from inference.catalog.fetching import (
    ATTEMPTS,
    BACKOFF_S,
    RETRIED,
    DownloadError,
    fetch_with_retries,
)
from inference.catalog.importing import free_path, safe_filename
from inference.catalog.netguard import AddressRefused, DownloadPolicy, redact_text
from inference.gguf import GGUFError, read_gguf
from inference.jobs import plain
from inference.serving.copies import WORKER_HEADER, CopyJob, write_status

log = logging.getLogger(__name__)

MiB = 1 << 20
PROGRESS_EVERY_S = 0.25


def web_box_policy(url: str, base: DownloadPolicy | None = None) -> DownloadPolicy:
    """The download policy (the settings' unless `base`) with the web box of `url` trusted:
    each of its addresses, at its port only. Its own Redis and database stay refused."""
    base = base or netguard.settings_policy()
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    web = {(address, port) for address in netguard.lookup(parts.hostname or "", port)}
    return DownloadPolicy(base.allow_private, base.services, base.trusted | web)


class CopyProgress:
    """The progress a download reports (inference.jobs.JobProgress's calls), written to Redis
    as this worker's CopyStatus of the file, at most every PROGRESS_EVERY_S."""

    def __init__(self, client: redis.Redis, job: CopyJob, worker: str):
        self.client, self.job, self.worker = client, job, worker
        self._last = 0.0

    def say(self, state, done: int = 0, message: str = "") -> None:
        write_status(self.client, self.job.sha256, self.worker, state, done=done,
                     total=self.job.size_bytes, message=message)  # fmt: skip

    def note(self, message: str) -> None:
        self.say("copying", message=message)
        self._last = time.monotonic()

    def update(self, done: int, total: int | None, verb: str = "") -> None:
        expected = self.job.size_bytes
        if done > expected or (total is not None and total != expected):
            # Not the file the web side described: stop now rather than after gigabytes.
            raise DownloadError(f"the web box sent {max(done, total or 0)} bytes or more; "
                                f"{self.job.model} has {expected}")  # fmt: skip
        now = time.monotonic()
        if now - self._last < PROGRESS_EVERY_S and done != expected:
            return
        self._last = now
        self.say("copying", done, f"copied {done / MiB:.1f} of {expected / MiB:.1f} MiB")

    def check(self) -> None:
        """Nothing cancels a copy but the worker's end."""


def part_path(sha256: str) -> Path:
    return Path(settings.MODELS_DIR).resolve() / f".copy-{sha256}.part"


def copy_model(
    job: CopyJob, worker: str, client: redis.Redis, *,
    policy: DownloadPolicy | None = None, attempts: int = ATTEMPTS, backoff: float = BACKOFF_S,
) -> Path | None:  # fmt: skip
    """Fetch, verify and install `job`'s file; its path here, or None (the CopyStatus says
    why)."""
    progress = CopyProgress(client, job, worker)
    part = part_path(job.sha256)
    part.unlink(missing_ok=True)  # a token serves one transfer: nothing to resume
    try:
        progress.note(f"connecting to the web box for {job.model}")
        # 1.
        policy = web_box_policy(job.url, policy)
        headers = {"Authorization": f"Bearer {job.token}", WORKER_HEADER: worker}
        digest = fetch_with_retries(job.url, part, progress, attempts, backoff, policy, headers)
        # 2.
        if digest != job.sha256:
            raise DownloadError(f"the bytes that arrived have sha256 {digest}, not the model's "
                                f"{job.sha256}; the copy is refused")  # fmt: skip
        # 3.
        progress.note("checking the file")
        read_gguf(part)
        target = free_path(safe_filename(job.filename))
        os.replace(part, target)
    except (AddressRefused, DownloadError, GGUFError, ValueError, OSError, *RETRIED) as exc:
        message = plain.message(exc) if isinstance(exc, GGUFError) else _describe(exc)
        log.warning("copy of %s from the web box failed: %s", job.model, message)
        progress.say("failed", message=message)
        return None
    except Exception as exc:
        progress.say("failed", message=f"the copy stopped: {_describe(exc)}")
        raise
    finally:
        part.unlink(missing_ok=True)
    log.info("copied %s from the web box to %s", job.model, target)
    write_status(client, job.sha256, worker, "done", done=job.size_bytes, total=job.size_bytes,
                 message=f"copied to {target.name} on {worker}")  # fmt: skip
    return target


def _describe(exc: Exception) -> str:
    return redact_text(str(exc) or type(exc).__name__)
