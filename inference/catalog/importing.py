"""Registering GGUF files: from the models directory, installed packages, uploads and imports.

Every file is read with the validating GGUF reader before a record exists, so a registered
model always has a header we trust; a file the reader refuses is never registered. Hashing is
streamed in chunks (a model can be tens of GB) and can run later as a job, with progress.
"""

import hashlib
import logging
import math
import os
import re
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.validators import validate_slug
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone
from django.utils.text import slugify

from inference.catalog.specs import kept_slots
from inference.catalog.starter import packaged_models
from inference.gguf import ArraySummary, GGUFError, GGUFInfo, fim_tokens, read_gguf
from inference.gguf.projector import is_projector
from inference.jobs import plain
from inference.jobs.progress import JobCancelled, JobProgress
from inference.models import Job, LLMModel, Projector
from inference.planning.preflight import estimate_for_settings, gguf_info

log = logging.getLogger(__name__)

CHUNK_BYTES = 4 << 20
# Paths under /models/ that a model name must not shadow.
RESERVED_NAMES = frozenset({"scan", "upload", "download", "pull", "derive", "jobs", "status"})
# Metadata arrays longer than this are kept as their length only: per-layer values stay, a
# vocabulary, its scores and merges do not.
KEEP_LIST_ITEMS = 256
KEEP_STRING_CHARS = 4096

Progress = Callable[[int, int], None]  # (bytes done, bytes total)
# Starts a hash job for a model: inference.jobs.tasks.schedule_hash. Passed in, because the job is a
# task that wraps this module's hash_model_job, and the tasks module depends on this one.
ScheduleHash = Callable[[LLMModel], Job]


class ImportRefused(ValueError):
    """A file or name cannot be registered; the message says why."""


class IsProjector(ImportRefused):
    """The file is a vision projector (a CLIP mmproj file), which is registered with the model it
    serves, never as a model of its own."""

    def __init__(self, path: str | os.PathLike[str]):
        super().__init__(
            f"{Path(path).name} is a vision projector (mmproj), not a language model: register "
            "it with its model (import_model MODEL --mmproj FILE, or the model page's Projector)"
        )


class AlreadyRegistered(ImportRefused):
    """The file is registered already, at this path or as the same bytes elsewhere (a copy):
    one entry per file. `model` is the entry that holds it."""

    def __init__(self, model: LLMModel, how: str):
        super().__init__(f"this file is already registered as {model.name} ({how})")
        self.model = model


# 1. Hashing.


def sha256_file(path: str | os.PathLike[str], progress: Progress | None = None) -> str:
    """The file's sha256, read in chunks; `progress(done, total)` after each chunk."""
    digest = hashlib.sha256()
    total = os.path.getsize(path)
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(done, total)
    return digest.hexdigest()


# 2. What the header says, as model fields.


def header_fields(info: GGUFInfo) -> dict[str, Any]:
    return {
        "size_bytes": info.file_size,
        "architecture": (info.architecture or "")[:64],
        "parameter_count": info.parameter_count,
        "quantization": (info.quantization or "")[:32],
        "context_length": info.context_length,
        "layer_count": info.layer_count,
        "embedding_length": info.embedding_length,
        "head_count": info.head_count,
        "head_count_kv": info.head_count_kv,
        "chat_template": info.chat_template or "",
        "tokenizer": (info.tokenizer_model or "")[:64],
        "license": (info.license or "")[:200],
        "metadata": metadata_summary(info),
    }


def metadata_summary(info: GGUFInfo) -> dict[str, Any]:
    """A JSON-safe summary: the special tokens prompting needs, the figures the pages show,
    and every metadata key with long arrays reduced to their length (never the vocabulary)."""
    keys = {}
    for key, value in info.metadata.items():
        if key == "tokenizer.chat_template":
            continue  # kept whole in its own field
        keys[key] = _json_safe(value)
    return {
        "bos_token": info.bos_token or "",
        "eos_token": info.eos_token or "",
        "bos_token_id": info.bos_token_id,
        "eos_token_id": info.eos_token_id,
        "vocab_size": info.vocab_size,
        "key_length": info.key_length,
        "value_length": info.value_length,
        "weights_bytes": info.weights_bytes,
        "gguf_version": info.version,
        "tensor_count": info.tensor_count,
        "name": info.name or "",
        # The fill-in-the-middle tokens llama.cpp finds (LLMModel.fim_tokens, capability insert).
        "fim": fim_tokens.as_record(info.fim),
        "keys": keys,
    }


def _json_safe(value: Any, depth: int = 0) -> Any:
    if isinstance(value, ArraySummary):
        return {"array": value.element_type, "length": value.length}
    if isinstance(value, list):
        if len(value) > KEEP_LIST_ITEMS or depth > 1:
            return {"array": "list", "length": len(value)}
        return [_json_safe(v, depth + 1) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, str) and len(value) > KEEP_STRING_CHARS:
        return value[:KEEP_STRING_CHARS] + "…"
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return repr(value)[:KEEP_STRING_CHARS]


# 3. Names and places.


def models_dir() -> Path:
    return Path(settings.MODELS_DIR).resolve()


def inside_models_dir(path: str | os.PathLike[str]) -> bool:
    return Path(path).resolve().is_relative_to(models_dir())


def name_from_path(path: Path) -> str:
    """A slug from the file name: "SmolLM2-135M-Instruct.Q4_1.gguf" becomes
    "smollm2-135m-instruct-q4_1"."""
    stem = path.name[: -len(".gguf")] if path.name.lower().endswith(".gguf") else path.stem
    return slugify(stem.replace(".", "-"))[:90].strip("-_") or "model"


def unique_name(base: str) -> str:
    """`base`, or `base-2`, `base-3`… : the first that no record (hidden ones too) holds."""
    taken = set(LLMModel.all_objects.filter(name__startswith=base).values_list("name", flat=True))
    if base not in taken and base not in RESERVED_NAMES:
        return base
    n = 2
    while f"{base}-{n}" in taken:
        n += 1
    return f"{base}-{n}"


def check_name(name: str) -> str:
    """A name a person chose: a free slug that no page path uses."""
    try:
        validate_slug(name)
    except Exception:
        raise ImportRefused(
            f"name {name!r} must use only letters, digits, hyphens and underscores"
        ) from None
    if len(name) > 100:
        raise ImportRefused("a model name must be at most 100 characters")
    if name in RESERVED_NAMES:
        raise ImportRefused(f"name {name!r} is reserved")
    if LLMModel.all_objects.filter(name=name).exists():
        raise ImportRefused(f"a model named {name!r} is already registered")
    return name


def safe_filename(name: str) -> str:
    """The last path part of an uploaded or downloaded name, in plain characters, ending .gguf."""
    base = re.sub(r"[^A-Za-z0-9._-]+", "-", Path(name.replace("\\", "/")).name).strip(".-")
    base = base[:150] or "model"
    return base if base.lower().endswith(".gguf") else base + ".gguf"


def free_path(filename: str) -> Path:
    """A path in the models directory that no file holds yet."""
    target = models_dir() / filename
    stem = filename[: -len(".gguf")]
    n = 2
    while target.exists():
        target = models_dir() / f"{stem}-{n}.gguf"
        n += 1
    return target


# 4. Registering.


def register_file(
    path: str | os.PathLike[str],
    *,
    source: str,
    name: str | None = None,
    hash_file: bool = True,
    progress: Progress | None = None,
    sha256: str = "",
    projector: Projector | None = None,
) -> LLMModel:
    """Register a GGUF file, or refresh the record that already holds it (idempotent); with
    `projector` (registered and checked against this file by inference.catalog.projectors), the
    entry of the file with that projector: one file may have a text-only entry and one per
    projector.

    Raises GGUFError when the reader refuses the file (nothing is registered), ImportRefused
    for a bad or taken name or a projector file (IsProjector), AlreadyRegistered when another
    entry holds the same bytes. With hash_file=False the sha256 stays empty for a hash job
    unless a copy check computed it; `sha256` is the caller's, when it hashed the file on the
    way (a download, a copy).
    """
    resolved = Path(path).resolve()
    info = read_gguf(resolved)
    if is_projector(info):
        raise IsProjector(resolved)
    fields = header_fields(info)
    existing = LLMModel.all_objects.filter(file_path=str(resolved), projector=projector,
                                           base__isnull=True).first()  # fmt: skip
    if existing is not None:
        return _refresh(existing, fields, hash_file=hash_file, progress=progress)
    same_file = LLMModel.all_objects.filter(file_path=str(resolved), base__isnull=True).first()
    if same_file is not None:  # its entry with another projector, or none: the same bytes
        sha256 = sha256 or same_file.sha256
    else:
        copy_of, sha256 = registered_copy(resolved, info.file_size, sha256)
        if copy_of is not None:
            raise AlreadyRegistered(copy_of, "the same file: its sha256 matches")

    chosen = check_name(name) if name else unique_name(name_from_path(resolved))
    model = LLMModel(file_path=str(resolved), name=chosen, source=source, projector=projector,
                     **fields)  # fmt: skip
    # n_ctx stays 0, automatic: sized at each load from the training context and free memory.
    model.estimated_bytes = estimated_total(model, info)
    model.sha256 = sha256
    if hash_file and not sha256:
        model.sha256 = sha256_file(resolved, progress)
    try:
        with transaction.atomic():
            model.is_default = not LLMModel.objects.filter(is_default=True).exists()
            model.save()
    except IntegrityError:
        # Registered meanwhile by someone else (a scan racing an upload): that record wins.
        existing = LLMModel.all_objects.filter(file_path=str(resolved), projector=projector,
                                               base__isnull=True).first()  # fmt: skip
        if existing is None:
            raise ImportRefused(f"the name {chosen!r} was taken meanwhile; try again") from None
        return existing
    log.info("registered %s (%s, %s)", model.name, resolved, model.quantization)
    return model


def registered_copy(path: Path, size: int, sha256: str = "") -> tuple[LLMModel | None, str]:
    """(the listed entry whose file has the same bytes as `path` at another path, or None;
    the file's sha256 if it is known now, else "").

    Only a file of the same size can hold the same bytes, so the file is hashed here only when
    an entry of its size exists; such an entry not hashed yet is hashed too (and its hash
    kept). Hidden entries (a deleted packaged model) do not count: registering the same file
    by hand after deleting it is how someone brings it back.
    """
    candidates = list(
        LLMModel.objects.filter(size_bytes=size, base__isnull=True).exclude(file_path=str(path))
    )
    if not candidates:
        return None, sha256
    digest = sha256 or sha256_file(path)
    for candidate in candidates:
        theirs = candidate.sha256
        if not theirs and os.path.isfile(candidate.file_path):
            theirs = sha256_file(candidate.file_path)
            LLMModel.all_objects.filter(pk=candidate.pk, sha256="").update(sha256=theirs)
        if theirs == digest:
            return candidate, digest
    return None, digest


def copies(models: list[LLMModel]) -> dict[int, list[LLMModel]]:
    """Model pk -> the other entries with the same sha256: duplicates registered before one
    entry per file was enforced, shown on the pages so one can be deleted."""
    by_hash: dict[str, list[LLMModel]] = {}
    for model in models:
        if model.sha256 and not model.base_id:  # a derived model shares its base's on purpose
            by_hash.setdefault(model.sha256, []).append(model)
    # Entries of one file (with different projectors) share it on purpose too.
    found = {
        model.pk: [other for other in group if other.file_path != model.file_path]
        for group in by_hash.values() if len(group) > 1 for model in group
    }  # fmt: skip
    return {pk: others for pk, others in found.items() if others}


def install_file(
    partial: str | os.PathLike[str],
    filename: str,
    *,
    source: str,
    name: str | None = None,
    sha256: str = "",
    projector: Projector | None = None,
) -> LLMModel:
    """Validate a complete file that arrived in the models directory (an upload, a download, a
    copy), rename it into place as a free variant of `filename` and register it (with
    `projector`, checked against it by the caller), storing `sha256` when the caller hashed it
    on the way (empty: for a hash job).

    Raises GGUFError with `partial` left where it is (the caller removes it), ImportRefused for
    a bad or taken name; a file that cannot be registered is removed, never left unrecorded.
    """
    read_gguf(partial)  # before it becomes a model file
    target = free_path(filename)
    os.replace(partial, target)  # same directory: atomic
    try:
        model = register_file(target, source=source, name=name, hash_file=False, sha256=sha256,
                              projector=projector)  # fmt: skip
    except BaseException:
        target.unlink(missing_ok=True)  # no file without its record (a copy's included)
        raise
    return model


def _refresh(model: LLMModel, fields: dict, *, hash_file: bool, progress: Progress | None):
    changed = model.size_bytes != fields["size_bytes"]
    for key, value in fields.items():
        setattr(model, key, value)
    if changed:
        model.sha256 = ""  # a different file now lives at this path
    if hash_file and not model.sha256:
        model.sha256 = sha256_file(model.file_path, progress)
    model.save()
    return model


def estimated_total(model: LLMModel, info: GGUFInfo) -> int | None:
    estimate = estimate_for_settings(
        info, ctx_per_seq=model.n_ctx, parallel=model.parallel, kv_type=model.kv_type,
        n_gpu_layers=model.n_gpu_layers, n_batch=model.n_batch, n_ubatch=model.n_ubatch,
        cache_slots=kept_slots(model.parallel),
        mmproj_path=model.projector.file_path if model.projector_id else "",
    )  # fmt: skip
    return estimate.total_bytes if estimate else None


def register_packaged_models() -> list[LLMModel]:
    """The GGUF files installed packages carry (the starter model), registered once; called at
    every start. A packaged model someone deleted stays hidden."""
    registered = []
    for name, path in packaged_models():
        resolved = path.resolve()
        record = (
            LLMModel.all_objects.filter(file_path=str(resolved), projector__isnull=True,
                                        base__isnull=True).first()  # fmt: skip
            or LLMModel.all_objects.filter(name=name, source=LLMModel.Source.PACKAGE).first()
        )
        if record is not None and record.hidden:
            continue
        if record is not None and record.file_path != str(resolved):
            # A reinstalled or upgraded package: the same model at a new path.
            record.file_path = str(resolved)
            record.save(update_fields=["file_path"])
        if record is not None and record.sha256 and record.size_bytes == resolved.stat().st_size:
            registered.append(record)  # nothing changed: the common case at every start
            continue
        # A user's own model may hold the package's name already: then a derived one.
        free = record is None and not LLMModel.all_objects.filter(name=name).exists()
        try:
            # An existing record is found by its path and refreshed (and hashed if it is not).
            model = register_file(resolved, source=LLMModel.Source.PACKAGE,
                                  name=name if free else None)  # fmt: skip
        except AlreadyRegistered as exc:
            # Imported by hand before (a copy): that entry is the starter model now.
            log.info("packaged model %s at %s: %s", name, resolved, exc)
            registered.append(exc.model)
            continue
        except (GGUFError, ImportRefused, OSError) as exc:
            log.error("packaged model %s at %s not registered: %s", name, resolved, exc)
            continue
        registered.append(model)
    return registered


def scan_models_dir(schedule_hash: ScheduleHash) -> list[LLMModel]:
    """Register new .gguf files under MODELS_DIR (idempotent); invalid files are skipped with
    the reason logged. New models are hashed by jobs, so a start is not held up by hashing."""
    new, _ = scan_report(schedule_hash)
    return new


def scan_report(schedule_hash: ScheduleHash) -> tuple[list[LLMModel], list[tuple[str, str]]]:
    """(models registered now, [(path, reason) of every file skipped as invalid])."""
    from inference.catalog.projectors import file_is_projector, looks_like_projector

    root = models_dir()
    known = set(LLMModel.all_objects.values_list("file_path", flat=True))
    known |= set(Projector.objects.values_list("file_path", flat=True))
    new: list[LLMModel] = []
    skipped: list[tuple[str, str]] = []
    projectors: list[Path] = []
    for path in sorted(root.rglob("*.gguf")):
        # Dot-names are ours in progress (uploads, downloads) or hidden on purpose.
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue
        if not path.is_file() or str(path.resolve()) in known:
            continue
        if looks_like_projector(path) or file_is_projector(path):
            projectors.append(path)  # never a model of its own: paired below
            continue
        try:
            model = register_file(path, source=LLMModel.Source.SCAN, hash_file=False)
        except (GGUFError, ImportRefused) as exc:
            log.warning("skipping %s: %s", path, exc)
            skipped.append((str(path), plain.message(exc)))  # its sentence, then the detail
            continue
        known.add(model.file_path)
        new.append(model)
    new = pair_beside(projectors, new, skipped)
    for model in new:
        schedule_hash(model)
    _resume_hashing(schedule_hash, exclude={m.pk for m in new})
    clean_partial_files()
    return new, skipped


def pair_beside(
    projector_files: list[Path], new: list[LLMModel], skipped: list[tuple[str, str]]
) -> list[LLMModel]:
    """The scan's pairing, as llama-server's -hf pairs a repository's mmproj with its model:
    each projector file found now is registered, and each model in its directory without a
    projector gets the first projector there that fits it (by file name), when the model or
    that projector is new in this scan (a pairing someone undid on the page stays undone).
    Returns `new` with its paired entries as they are now."""
    from inference.catalog.projectors import projector_problem, register_projector

    fresh: set[int] = set()
    for path in projector_files:
        try:
            fresh.add(register_projector(path, source=LLMModel.Source.SCAN, n_embd=None).pk)
        except (GGUFError, OSError) as exc:
            log.warning("skipping the projector %s: %s", path, exc)
            skipped.append((str(path), plain.message(exc) if isinstance(exc, GGUFError)
                            else str(exc)))  # fmt: skip
    new_pks = {model.pk for model in new}
    places = {Path(model.file_path).parent for model in new}
    places |= {Path(p.file_path).parent for p in Projector.objects.filter(pk__in=fresh)}
    by_place: dict[Path, list[Projector]] = {}
    for projector in Projector.objects.all():
        by_place.setdefault(Path(projector.file_path).parent, []).append(projector)
    paired: dict[int, LLMModel] = {}
    for model in LLMModel.objects.filter(base__isnull=True, projector__isnull=True):
        place = Path(model.file_path).parent
        if place not in places:
            continue
        for projector in sorted(by_place.get(place, []), key=lambda p: p.file_path):
            if model.pk not in new_pks and projector.pk not in fresh:
                continue
            if projector_problem(model, projector) is None:
                model.projector = projector
                model.estimated_bytes = estimated_total(model, gguf_info(model.file_path))
                model.save(update_fields=["projector", "estimated_bytes"])
                log.info("%s takes images with %s, found beside it", model.name,
                         projector.file_name)  # fmt: skip
                paired[model.pk] = model
                break
    return [paired.get(model.pk, model) for model in new]


# A job that wrote no progress for this long died with its process (progress is written every
# fraction of a second while a job runs).
STALE_JOB_S = 600
# An upload or import partial file untouched this long was left by a dead request or command.
STALE_PARTIAL_S = 6 * 3600


def _active_jobs(kind: str):
    cutoff = timezone.now() - timedelta(seconds=STALE_JOB_S)
    return Job.objects.filter(
        kind=kind, state__in=[Job.State.PENDING, Job.State.RUNNING], updated_at__gte=cutoff
    )


def _resume_hashing(schedule_hash: ScheduleHash, exclude: set[int]) -> None:
    """Models left unhashed by a job that died (a restart mid-hash) get a new job."""
    hashing = set(_active_jobs(Job.Kind.HASH).values_list("model_id", flat=True))
    for model in LLMModel.objects.filter(sha256="").exclude(pk__in=hashing | exclude):
        if os.path.isfile(model.file_path):
            schedule_hash(model)


def clean_partial_files() -> list[str]:
    """Remove partial files nobody will finish: a download's once its job is no longer active,
    an upload's or import's once untouched for hours. Returns the names removed."""
    active = set(_active_jobs(Job.Kind.DOWNLOAD).values_list("id", flat=True))
    removed = []
    now = time.time()
    # Blob uploads (inference.catalog.blobs) write theirs in .blobs/; they go by age like an
    # upload's.
    for path in [*models_dir().glob(".*.part"), *models_dir().glob(".blobs/.*.part")]:
        download = re.fullmatch(r"\.download-(\d+)\.part", path.name)
        if download:
            stale = int(download.group(1)) not in active
        else:
            try:
                stale = now - path.stat().st_mtime > STALE_PARTIAL_S
            except FileNotFoundError:
                continue
        if stale:
            path.unlink(missing_ok=True)
            removed.append(path.name)
            log.info("removed the abandoned partial file %s", path)
    return removed


# 5. Hash jobs (started by inference.jobs.tasks.schedule_hash).


def hash_model_job(job_id: int) -> str | None:
    """Run a hash job: the model's sha256 stored, the job done. Idempotent: a finished job or
    an already hashed model is left as it is."""
    job = Job.objects.select_related("model").filter(pk=job_id).first()
    if job is None or job.state in (Job.State.DONE, Job.State.CANCELLED):
        return None
    progress = JobProgress(job_id)
    model = job.model
    if model is None:
        progress.fail("the model was deleted before it was hashed")
        return None
    if model.sha256:
        progress.finish(f"sha256 {model.sha256}")
        return model.sha256
    try:
        progress.start("hashing")
        digest = sha256_file(
            model.file_path, lambda done, total: progress.update(done, total, "hashed")
        )
    except JobCancelled:
        return None
    except OSError as exc:
        progress.fail(f"cannot read {model.file_path}: {exc.strerror or exc}")
        return None
    # Every entry of the file (one per projector) has these bytes.
    LLMModel.all_objects.filter(file_path=model.file_path, base__isnull=True).filter(
        Q(pk=model.pk) | Q(sha256="")).update(sha256=digest)
    progress.finish(f"sha256 {digest}")
    return digest
