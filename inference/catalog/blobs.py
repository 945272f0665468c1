"""Blobs: GGUF files uploaded by digest (Ollama's POST /api/blobs/sha256:<digest>), kept until
/api/create makes a model of them.

1. The free disk in MODELS_DIR is checked against the declared length before a byte is written.
2. The body streams into a hidden partial file in `.blobs/`, hashed as it arrives: on the
   appliance the gate writes it before the view runs (appliance.gate, `body_to`), else
   `receive` does, one upload of a digest at a time (a lock). A retry of the same digest starts
   again from the first byte, so a dropped upload never leaves a half file that counts.
3. A digest that does not match, or a file the validating GGUF reader refuses, removes the
   partial file; only then is it renamed to `.blobs/sha256-<hex>`, a blob that counts.

A digest also counts as present when a listed model or a registered vision projector has those
bytes already (an upload made a model earlier, or a pull): /api/create then gives that model
the new name instead of a copy.
The `.blobs` directory starts with a dot, so the models-directory scan never registers a blob.

A blob that no /api/create made into a model (which moves it out of `.blobs`) is removed once
BLOB_RETENTION_HOURS have passed since its upload ended (`prune`); so is a partial file nobody
writes any more. An upload in progress holds a lock on its partial file (here, and in the gate),
which `prune` never removes, nor a file a model's entry points at.
"""

import fcntl
import hashlib
import logging
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

from inference.catalog.importing import models_dir
from inference.gguf import GGUFError, read_gguf
from inference.models import LLMModel, Projector

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 << 20
_DIGEST = re.compile(r"^sha256[:-]([0-9a-f]{64})$")

Read = Callable[[int], bytes]  # read(n): up to n bytes of the body, b"" at its end


class BlobRefused(ValueError):
    """An upload or digest that cannot be taken; `status` is the HTTP status to answer."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def digest_hex(digest: str) -> str:
    """The 64 hex digits of "sha256:<hex>" (Ollama's form; "sha256-<hex>" too)."""
    match = _DIGEST.match(digest.strip().lower())
    if not match:
        raise BlobRefused(f"{digest!r} is not a digest of the form sha256:<64 hex digits>")
    return match.group(1)


def blobs_dir() -> Path:
    path = models_dir() / ".blobs"
    path.mkdir(exist_ok=True)
    return path


def blob_path(digest: str) -> Path:
    return blobs_dir() / f"sha256-{digest_hex(digest)}"


def model_with(digest: str) -> LLMModel | None:
    """The listed model (with weights of its own, still on disk) whose sha256 is `digest`."""
    hexdigest = digest_hex(digest)
    for model in LLMModel.objects.filter(sha256=hexdigest, base__isnull=True):
        if os.path.isfile(model.file_path):
            return model
    return None


def projector_with(digest: str) -> Projector | None:
    """The registered vision projector (still on disk) whose sha256 is `digest`."""
    for projector in Projector.objects.filter(sha256=digest_hex(digest)):
        if os.path.isfile(projector.file_path):
            return projector
    return None


def present(digest: str) -> bool:
    return (blob_path(digest).is_file() or model_with(digest) is not None
            or projector_with(digest) is not None)  # fmt: skip


def check_space(length: int | None) -> None:
    """Refuse (507) a body longer than the free disk in the models directory."""
    if not length:
        return
    free = shutil.disk_usage(models_dir()).free
    if length > free:
        raise BlobRefused(
            f"not enough disk space for this blob: it is {length / (1 << 20):.0f} MiB and "
            f"{free / (1 << 20):.0f} MiB is free in the models directory", status=507,
        )  # fmt: skip


def receive(digest: str, read: Read, length: int | None) -> Path:
    """Stream an upload into place (the module's steps); returns the blob's path. Raises
    BlobRefused: 400 for a wrong digest or no GGUF, 409 while another upload of it runs, 507
    for too little disk."""
    hexdigest = digest_hex(digest)
    check_space(length)
    part = blobs_dir() / f".sha256-{hexdigest}.part"
    fd = os.open(part, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BlobRefused("another upload of this blob is under way", status=409) from None
        os.ftruncate(fd, 0)  # a retry starts from the first byte
        hasher = hashlib.sha256()
        with os.fdopen(os.dup(fd), "wb") as out:
            while chunk := read(CHUNK_BYTES):
                hasher.update(chunk)
                out.write(chunk)
        return adopt(digest, part, hasher.hexdigest())
    finally:
        os.close(fd)


def adopt(digest: str, part: Path, sha256: str) -> Path:
    """Step 3 for a complete file in the blobs directory whose sha256 is known (hashed as it
    arrived: by receive, or by the gate, which streams large bodies itself): kept as the blob
    `digest` names, or removed and refused."""
    hexdigest = digest_hex(digest)
    kept = False
    try:
        if sha256 != hexdigest:
            raise BlobRefused(f"the upload's digest sha256:{sha256} is not the "
                              f"sha256:{hexdigest} it was sent as; it was discarded")  # fmt: skip
        try:
            read_gguf(part)
        except GGUFError as exc:
            raise BlobRefused(
                f"the blob is not a GGUF model the appliance can load: {exc}"
            ) from None
        target = blob_path(digest)
        os.replace(part, target)  # same directory: atomic (two uploads of it: the same bytes)
        kept = True
        return target
    finally:
        if not kept:
            part.unlink(missing_ok=True)


def in_progress(path: Path) -> bool:
    """Whether an upload still writes this partial file: it holds the file's lock."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # (and with it the lock, had this taken it)
    return False


@dataclass(frozen=True, slots=True)
class Pruned:
    removed: list[str]  # file names
    next_in: float | None  # seconds until the next file left here is due; None: none is left


def prune(now: float | None = None) -> Pruned:
    """Remove the blobs no model was made of, and the partial files no upload writes, once
    BLOB_RETENTION_HOURS have passed since they were last written."""
    now = time.time() if now is None else now
    keep = settings.BLOB_RETENTION_HOURS * 3600
    used = set(LLMModel.all_objects.values_list("file_path", flat=True))
    removed: list[str] = []
    due: list[float] = []
    for path in blobs_dir().iterdir():
        try:
            age = now - path.stat().st_mtime
        except FileNotFoundError:  # adopted or removed meanwhile
            continue
        partial = path.name.endswith(".part")
        if not path.is_file() or str(path) in used or (partial and in_progress(path)):
            continue
        if age < keep:
            due.append(keep - age)
            continue
        path.unlink(missing_ok=True)
        removed.append(path.name)
        why = "a partial upload nobody wrote" if partial else "a blob no model was made of"
        log.info("removed %s: %s for %d h", path.name, why, settings.BLOB_RETENTION_HOURS)
    return Pruned(removed, min(due) if due else None)
