"""Vision projectors in the catalog: registering an mmproj GGUF (inference.models.Projector) and
pairing it with a model, every way a model is registered (import_model --mmproj, the
models-directory scan, the model page, /api/create's files, /api/pull hf.co/…).

A projector's file is read with the validating reader and its header checked against the
language model it is paired with (inference.gguf.projector: a CLIP vision encoder of a type
this llama.cpp knows, as wide as the model's n_embd, with bounded sizes) before a record or a
pairing exists; libmtmd never reads a file that failed. Projectors are hashed when registered:
they are small (tens of MB to about a GB), and split mode finds a worker's copy by the digest.
"""

import logging
import os
from pathlib import Path

from django.db import IntegrityError, transaction

from inference.catalog.importing import (
    ImportRefused,
    check_name,
    estimated_total,
    metadata_summary,
    sha256_file,
    unique_name,
)
from inference.gguf import GGUFError, read_gguf
from inference.gguf.projector import ProjectorError, ProjectorInfo, check_projector, is_projector
from inference.models import LLMModel, Projector
from inference.planning.preflight import gguf_info

log = logging.getLogger(__name__)

MMPROJ_PREFIX = "mmproj"  # how llama.cpp's and Hugging Face's projector files are named


def looks_like_projector(path: str | os.PathLike[str]) -> bool:
    """By the name alone: "mmproj-model-f16.gguf", "mmproj.gguf" (llama-server's -hf and the
    scan pair such a file with the model beside it)."""
    name = Path(path).name.lower()
    return name.startswith(MMPROJ_PREFIX) and name.endswith(".gguf")


def register_projector(
    path: str | os.PathLike[str], *, source: str, n_embd: int | None, sha256: str = ""
) -> Projector:
    """Register the projector at `path`, checked for a language model `n_embd` wide (None: not
    checked here; pairing checks it), or refresh the record that holds the file (idempotent).
    Raises GGUFError (a ProjectorError naming what is wrong) and records nothing when the file
    fails; `sha256` is the caller's, when it hashed the file on the way."""
    resolved = Path(path).resolve()
    info = read_gguf(resolved)
    checked = check_projector(info, n_embd)
    fields = _fields(info, checked)
    existing = Projector.objects.filter(file_path=str(resolved)).first()
    if existing is not None and existing.size_bytes == checked.file_size and existing.sha256:
        for key, value in fields.items():
            setattr(existing, key, value)
        existing.save()
        return existing
    digest = sha256 or sha256_file(resolved)
    if existing is not None:  # another file at this path now
        for key, value in {**fields, "sha256": digest}.items():
            setattr(existing, key, value)
        existing.save()
        return existing
    try:
        with transaction.atomic():
            projector = Projector.objects.create(file_path=str(resolved), source=source,
                                                 sha256=digest, **fields)  # fmt: skip
    except IntegrityError:  # registered meanwhile (a scan racing an import): that one
        return Projector.objects.get(file_path=str(resolved))
    log.info("registered the projector %s (%s)", resolved, checked.projector_type)
    return projector


def _fields(info, checked: ProjectorInfo) -> dict:
    return {
        "size_bytes": checked.file_size, "projector_type": checked.projector_type,
        "projection_dim": checked.projection_dim, "image_size": checked.image_size,
        "patch_size": checked.patch_size, "metadata": metadata_summary(info),
    }  # fmt: skip


def projector_problem(model: LLMModel, projector: Projector) -> str | None:
    """Why `projector` cannot serve `model`'s weights (None: it can, as far as the headers
    tell), as drafts.draft_problem says it for a draft model."""
    try:
        n_embd = gguf_info(model.weights.file_path).embedding_length
        check_projector(gguf_info(projector.file_path), n_embd)
    except ProjectorError as exc:
        return str(exc)
    except (GGUFError, OSError) as exc:
        return f"its file cannot be read: {exc}"
    return None


def file_is_projector(path: str | os.PathLike[str]) -> bool:
    """Whether a GGUF is a CLIP projector rather than a model (False for an unreadable one:
    registering it as a model then refuses it with the reader's reason)."""
    try:
        return is_projector(gguf_info(path))
    except (GGUFError, OSError):
        return False


def with_projector(model: LLMModel, projector: Projector, *, name: str | None = None
                   ) -> LLMModel:  # fmt: skip
    """`model`'s weights with `projector`: `model` itself when it has none yet (it becomes a
    vision model), the entry that pairs the two already, or a new entry of the same file with
    this projector (several projectors for one language model), named `name` or after the
    projector. Raises ImportRefused when the projector does not fit the model."""
    weights = model.weights
    problem = projector_problem(weights, projector)
    if problem:
        raise ImportRefused(f"the projector {projector.file_name} cannot serve "
                            f"{weights.name}: {problem}")  # fmt: skip
    paired = LLMModel.all_objects.filter(file_path=weights.file_path, projector=projector,
                                         base__isnull=True).first()  # fmt: skip
    if paired is not None:
        return paired
    info = gguf_info(weights.file_path)
    if weights.projector_id is None and not name:
        weights.projector = projector
        weights.estimated_bytes = estimated_total(weights, info)
        weights.save(update_fields=["projector", "estimated_bytes"])
        log.info("%s takes images now, with %s", weights.name, projector.file_name)
        return weights
    chosen = check_name(name) if name else unique_name(f"{weights.name}-vision")
    # The weights' entry as the starting point (its settings), as a new record.
    entry = LLMModel.all_objects.get(pk=weights.pk)
    entry.pk = entry.id = None
    entry._state.adding = True  # a new row: created_at is now
    entry.name, entry.projector, entry.is_default, entry.hidden = chosen, projector, False, False
    entry.last_used_at = entry.measured_bytes = entry.last_load_seconds = None
    entry.estimated_bytes = estimated_total(entry, info)
    entry.save()
    log.info("%s: %s's weights with %s", entry.name, weights.name, projector.file_name)
    return entry
