"""Ollama's model making: HEAD/POST /api/blobs/sha256:<digest>, /api/create, /api/copy, and
/api/push (refused: the appliance does not publish models). Every one needs an admin key, as
pulling and deleting do.

A blob upload streams (inference.catalog.blobs): up to MAX_BLOB_BYTES, not
DATA_UPLOAD_MAX_MEMORY_SIZE.
Served by the appliance, the gate writes the body into the blobs directory, hashed on the way,
after checking the key's scope and the free disk (appliance.gate, `body_to`), and the view
verifies and keeps that file; without the gate (Django's test client) the view reads the body
in chunks, never as request.body.

/api/create with `files` installs the blob as a model of its own, like an upload from the models
page (the validating reader, the same registration); a blob whose bytes a listed model holds
already, or `from` a model, makes a derived model instead (inference.catalog.creating): the
weights are shared, never copied, and its settings are its own. A second file whose header says
"clip" is the model's vision projector, as in Ollama's create: checked against the model and
registered with it (inference.catalog.projectors), an entry of its own even when the model's
bytes are registered already. The progress lines follow Ollama's
(`gathering model components`, `using existing layer sha256:…`, `writing manifest`, `success`),
or one object with `stream: false`; a refusal is an error status before any line.
"""

import logging
import os
from pathlib import Path

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from dashboard.api.auth import api_endpoint
from dashboard.api.bodies import parse_body
from dashboard.api.errors import ApiError
from dashboard.api.ollama.schemas import OllamaCopyRequest, OllamaCreateRequest
from dashboard.api.streaming import ndjson
from dashboard.models import ApiKey
from inference.catalog import blobs, creating, drafts
from inference.catalog.importing import ImportRefused, free_path, install_file, safe_filename
from inference.catalog.lookup import UnknownModel, resolve
from inference.catalog.projectors import file_is_projector, register_projector, with_projector
from inference.gguf import GGUFError, read_gguf
from inference.gguf.projector import check_projector
from inference.jobs.tasks import keep_blobs_pruned
from inference.models import LLMModel, Projector, PulledName
from inference.planning.preflight import gguf_info

log = logging.getLogger(__name__)

admin_post = api_endpoint(dialect="ollama", methods=("POST",), scope=ApiKey.Scope.ADMIN)


def _refused(exc: creating.CreateRefused | blobs.BlobRefused) -> ApiError:
    return ApiError(exc.status, str(exc), param=getattr(exc, "param", None))


@api_endpoint(dialect="ollama", methods=("HEAD", "POST"), scope=ApiKey.Scope.ADMIN,
              max_body=settings.MAX_BLOB_BYTES, body_to=blobs.blobs_dir)  # fmt: skip
async def blob(request: HttpRequest, digest: str) -> HttpResponse:
    try:
        if request.method == "HEAD":
            found = await sync_to_async(blobs.present)(digest)
            return HttpResponse(status=200 if found else 404)
        spooled = getattr(request, "scope", {}).get("appliance.body")
        if spooled is not None:  # the gate streamed it into the blobs directory already
            await sync_to_async(blobs.adopt, thread_sensitive=False)(
                digest, Path(spooled["path"]), spooled["sha256"]
            )
        else:
            length = int(request.headers.get("Content-Length") or 0) or None
            # Off the shared sync thread: an upload of gigabytes must not hold up the ORM's.
            await sync_to_async(blobs.receive, thread_sensitive=False)(
                digest, request.read, length
            )
    except blobs.BlobRefused as exc:
        raise _refused(exc) from None
    log.info("blob %s received (key %s)", digest, request.api_key.name)
    # It stays until a create makes a model of it, or BLOB_RETENTION_HOURS have passed.
    await sync_to_async(keep_blobs_pruned, thread_sensitive=False)()
    return HttpResponse(status=201)


def _make(body: OllamaCreateRequest) -> tuple[LLMModel, list[dict]]:
    """The model the request makes, and the progress lines that say how."""
    name = body.target
    if not name:
        raise creating.CreateRefused("model is required", "model")
    if body.quantize:
        raise creating.CreateRefused("quantizing is not supported: upload or pull the "
                                     "quantization you want", "quantize")  # fmt: skip
    if body.adapters:
        raise creating.CreateRefused("adapters (LoRA) are not supported", "adapters")
    parameters, ignored = creating.sampling_parameters(body.parameters)
    settings_ = {"system": body.system, "template": body.template, "parameters": parameters,
                 "messages": creating.seed_messages(body.messages),
                 "license": body.license_text}  # fmt: skip
    draft = None
    if body.draft:
        try:
            draft = resolve(body.draft)
        except UnknownModel as exc:
            raise creating.CreateRefused(str(exc), "draft", status=404) from None
        settings_["draft"] = draft
    lines = [{"status": "gathering model components"}]
    lines += [{"status": f"parameter {key} is not used: the base's load settings apply"}
              for key in ignored]  # fmt: skip
    if body.files:
        model = _from_blob(name, body.files, settings_, lines)
    elif body.from_:
        if draft is not None:
            raise _draft_on_derived(body.from_)
        try:
            base = resolve(body.from_)
        except UnknownModel as exc:
            raise creating.CreateRefused(str(exc), "from", status=404) from None
        lines.append({"status": f"using existing layer sha256:{base.weights.sha256}"})
        model = creating.derive(base, name, **settings_)
    else:
        raise creating.CreateRefused("create needs `from` (a model) or `files` (an uploaded "
                                     "blob)", "from")  # fmt: skip
    lines += [{"status": "writing manifest"}, {"status": "success"}]
    return model, lines


def _sorted_files(files: dict) -> tuple[tuple[str, str], tuple[str, str] | None]:
    """((file name, digest) of the language model, that of the vision projector or None) of a
    create's `files`: the projector is the GGUF whose header says "clip", as Ollama's create
    tells them apart."""
    if not files or len(files) > 2 or not all(f.lower().endswith(".gguf") for f in files):
        raise creating.CreateRefused("files must name one GGUF model file, and at most one "
                                     "vision projector GGUF beside it (no adapters)",
                                     "files")  # fmt: skip
    models, projectors = [], []
    for filename, digest in files.items():
        try:
            blobs.digest_hex(digest)
        except blobs.BlobRefused as exc:
            raise creating.CreateRefused(str(exc), "files") from None
        clip = blobs.projector_with(digest) is not None or (
            blobs.model_with(digest) is None and file_is_projector(blobs.blob_path(digest)))
        (projectors if clip else models).append((filename, digest))
    if len(models) != 1 or len(projectors) > 1:
        raise creating.CreateRefused(f"files hold {len(models)} language models and "
                                     f"{len(projectors)} vision projectors; a model is one "
                                     "of the first and at most one of the second",
                                     "files")  # fmt: skip
    return models[0], (projectors[0] if projectors else None)


def _projector_from_blob(filename: str, digest: str, model_path: str, lines: list[dict]
                         ) -> Projector:  # fmt: skip
    """The projector blob checked against the model file and registered (moved out of the
    blobs directory into the models directory), or the registered one with those bytes."""
    hexdigest = blobs.digest_hex(digest)
    lines.append({"status": f"using existing layer sha256:{hexdigest}"})
    n_embd = gguf_info(model_path).embedding_length
    projector = blobs.projector_with(digest)
    path = Path(projector.file_path) if projector else blobs.blob_path(digest)
    if projector is None and not path.is_file():
        raise creating.CreateRefused(f"blob sha256:{hexdigest} is not here; upload it first "
                                     "with POST /api/blobs/sha256:<digest>", "files")  # fmt: skip
    try:
        check_projector(read_gguf(path), n_embd)
    except GGUFError as exc:
        raise creating.CreateRefused(f"the vision projector {filename} cannot serve this "
                                     f"model: {exc}", "files") from None  # fmt: skip
    if projector is not None:
        return projector
    target = free_path(safe_filename(filename))
    os.replace(path, target)  # out of the blobs directory, which is pruned
    try:
        return register_projector(target, source=LLMModel.Source.UPLOAD, n_embd=n_embd,
                                  sha256=hexdigest)  # fmt: skip
    except BaseException:
        target.unlink(missing_ok=True)
        raise


def _checked_before_install(path: Path, hexdigest: str, name: str, settings_: dict,
                            draft: LLMModel | None) -> tuple[str, str]:  # fmt: skip
    """The new entry's (slug, display name), once the blob is here, the name free, the settings
    valid and the draft able to draft for it: checked before the file moves, so a refusal
    leaves the blob as it was."""
    if not path.is_file():
        raise creating.CreateRefused(f"blob sha256:{hexdigest} is not here; upload it first "
                                     "with POST /api/blobs/sha256:<digest>", "files")  # fmt: skip
    slug, display = creating.entry_name(name)
    if creating.name_taken(display) is not None:
        raise creating.CreateRefused(f"a model named {display} exists already; delete it first",
                                     "model", status=409)  # fmt: skip
    creating.apply_settings(LLMModel(metadata={}), **settings_)
    problem = drafts.file_problem(str(path), draft) if draft is not None else None
    if problem:
        raise creating.CreateRefused(f"{draft.name} cannot draft for this model: {problem}",
                                     "draft")  # fmt: skip
    return slug, display


def _from_blob(name: str, files: dict, settings_: dict, lines: list[dict]) -> LLMModel:
    (filename, digest), clip = _sorted_files(files)
    hexdigest = blobs.digest_hex(digest)
    lines.append({"status": f"using existing layer sha256:{hexdigest}"})
    existing = blobs.model_with(digest)
    draft = settings_.pop("draft", None)
    if clip is not None:
        return _vision_from_blobs(name, (filename, digest), clip, existing, draft, settings_,
                                  lines)  # fmt: skip
    if existing is not None:
        # Those bytes are loaded as a model already: share them, as Ollama's layers are shared
        # (an uploaded copy of them is not needed then).
        if draft is not None:
            raise _draft_on_derived(existing.name)
        model = creating.derive(existing, name, **settings_)
        blobs.blob_path(digest).unlink(missing_ok=True)
        return model
    path = blobs.blob_path(digest)
    slug, display = _checked_before_install(path, hexdigest, name, settings_, draft)
    try:
        model = install_file(path, safe_filename(filename), source=LLMModel.Source.UPLOAD,
                             name=slug, sha256=hexdigest)  # fmt: skip
    except ImportRefused as exc:
        raise creating.CreateRefused(str(exc), "model", status=409) from None
    except GGUFError as exc:
        path.unlink(missing_ok=True)
        raise creating.CreateRefused(f"the blob is not a GGUF model: {exc}", "files") from None
    creating.apply_settings(model, **settings_)
    model.draft = draft.weights if draft is not None else None
    model.save()
    if draft is not None:
        lines.append({"status": f"using {draft.name} as the draft model"})
    PulledName.objects.get_or_create(name=display, model=model)
    return model


def _vision_from_blobs(name: str, weights: tuple[str, str], clip: tuple[str, str],
                      existing: LLMModel | None, draft: LLMModel | None, settings_: dict,
                      lines: list[dict]) -> LLMModel:  # fmt: skip
    """A model file with a projector: an entry of its own (the projector is part of what
    loads), of the registered file when those bytes are one; a model derived from the entry
    that pairs the two already, when one does."""
    filename, digest = weights
    hexdigest = blobs.digest_hex(digest)
    path = Path(existing.file_path) if existing else blobs.blob_path(digest)
    slug, display = _checked_before_install(path, hexdigest, name, settings_, draft)
    try:
        read_gguf(path)
    except GGUFError as exc:
        raise creating.CreateRefused(f"the blob is not a GGUF model: {exc}", "files") from None
    projector = _projector_from_blob(*clip, str(path), lines)
    paired = LLMModel.objects.filter(file_path=str(path), projector=projector,
                                     base__isnull=True).first()  # fmt: skip
    if paired is not None:  # the same pair again: a model made from it, as for one file
        if draft is not None:
            raise _draft_on_derived(paired.name)
        blobs.blob_path(digest).unlink(missing_ok=True)
        return creating.derive(paired, name, **settings_)
    try:
        if existing is not None:
            model = with_projector(existing, projector, name=slug)
            blobs.blob_path(digest).unlink(missing_ok=True)
        else:
            model = install_file(path, safe_filename(filename), source=LLMModel.Source.UPLOAD,
                                 name=slug, sha256=hexdigest, projector=projector)  # fmt: skip
    except ImportRefused as exc:
        raise creating.CreateRefused(str(exc), "model", status=409) from None
    creating.apply_settings(model, **settings_)
    if draft is not None:
        model.draft = draft.weights
        lines.append({"status": f"using {draft.name} as the draft model"})
    model.save()
    lines.append({"status": f"using {projector.file_name} as the vision projector"})
    PulledName.objects.get_or_create(name=display, model=model)
    return model


def _draft_on_derived(base: str) -> creating.CreateRefused:
    return creating.CreateRefused(
        f"a draft model is a load setting, and a model made from {base} loads as {base}: set "
        f"the draft on {base} (its model page) instead", "draft")  # fmt: skip


@admin_post
async def create(request: HttpRequest) -> HttpResponse:
    body = parse_body(request, OllamaCreateRequest)
    try:
        model, lines = await sync_to_async(_make)(body)
    except creating.CreateRefused as exc:
        raise _refused(exc) from None
    log.info("created %s%s (key %s)", model.name,
             f" from {model.base.name}" if model.base_id else "", request.api_key.name)  # fmt: skip
    if not body.stream:
        return JsonResponse(lines[-1])
    return HttpResponse(b"".join(ndjson(line) for line in lines),
                        content_type="application/x-ndjson")  # fmt: skip


def _copy(body: OllamaCopyRequest) -> str:
    try:
        model = resolve(body.source)
    except UnknownModel as exc:
        raise creating.CreateRefused(str(exc), "source", status=404) from None
    return creating.add_name(model, body.destination)


@admin_post
async def copy(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, OllamaCopyRequest)
    try:
        name = await sync_to_async(_copy)(body)
    except creating.CreateRefused as exc:
        raise _refused(exc) from None
    log.info("%s copied to %s (key %s)", body.source, name, request.api_key.name)
    return JsonResponse({"status": "success"})


@admin_post
async def push(request: HttpRequest) -> JsonResponse:
    raise ApiError(501, "pushing models is not supported: the appliance serves the models it "
                   "has and publishes none to a registry", code="not_supported")  # fmt: skip
