"""The registry's changes, staff only: scan, upload, download, cancel, make default, and the
async load, unload, forget cached prompts and delete that await the inference client. They only
redirect (or answer JSON), so no template and no lazy ORM access runs on the event loop, except
the delete confirmation, rendered on a thread.
"""

import logging
import os
import shutil

from asgiref.sync import sync_to_async
from django.contrib import messages
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_http_methods, require_POST

from dashboard.model_pages import readings, views
from dashboard.model_pages.display import flash_text
from dashboard.model_pages.forms import (
    DownloadForm,
    ProjectorUploadForm,
    UploadForm,
    check_projector_for,
)
from dashboard.model_pages.uploads import ModelsDirUploadHandler
from dashboard.model_pages.views import job_json, wants_json
from dashboard.web.security import content_security_policy, staff_required
from inference.catalog import operations
from inference.catalog.importing import (
    AlreadyRegistered,
    ImportRefused,
    free_path,
    inside_models_dir,
    install_file,
    models_dir,
    safe_filename,
    scan_report,
)
from inference.catalog.operations import is_packaged, set_default
from inference.catalog.projectors import register_projector
from inference.gguf import GGUFError, read_gguf
from inference.gguf.projector import check_projector
from inference.jobs import plain, tasks
from inference.jobs.dispatch import dispatch
from inference.jobs.progress import cancel_job, dismiss_job
from inference.models import Job, LLMModel

log = logging.getLogger(__name__)


@staff_required
@require_POST
def scan(request: HttpRequest) -> HttpResponse:
    new, skipped = scan_report(tasks.schedule_hash)
    if new:
        messages.success(request, f"Registered {len(new)} new model(s): "
                                  + ", ".join(m.name for m in new))  # fmt: skip
    else:
        messages.info(request, "No new models in the models directory.")
    for path, reason in skipped:
        messages.warning(request, flash_text(f"Skipped {os.path.basename(path)}: {reason}"))
    return redirect("models")


@csrf_exempt  # the body must not be parsed before the upload handler is set; checked below
@staff_required
@require_POST
def upload(request: HttpRequest) -> HttpResponse:
    length = int(request.META.get("CONTENT_LENGTH") or 0)
    free = shutil.disk_usage(models_dir()).free
    if length > free:
        return _upload_refused(
            request,
            f"not enough disk space: the upload is {length >> 20} MiB, {free >> 20} MiB is free",
            413,
        )
    handler = ModelsDirUploadHandler(request)
    request.upload_handlers = [handler]
    try:
        return _upload(request)
    finally:
        handler.cleanup()  # whatever was not moved into place (refused, invalid, cut off)


@csrf_exempt  # as upload: the handler is set before the body is parsed; checked below
@staff_required
@require_POST
def upload_projector(request: HttpRequest, name: str) -> HttpResponse:
    """The model page's “Upload a projector”: an mmproj GGUF streamed into MODELS_DIR (as an
    upload is), checked against the model before it is kept, registered and made the model's
    projector; a file that fails is removed, with the reason said."""
    model = get_object_or_404(LLMModel.objects.filter(base__isnull=True), name=name)
    length = int(request.META.get("CONTENT_LENGTH") or 0)
    if length > shutil.disk_usage(models_dir()).free:
        messages.error(request, "Not enough disk space for this projector.")
        return redirect("model-detail", name=model.name)
    handler = ModelsDirUploadHandler(request)
    request.upload_handlers = [handler]
    try:
        return _upload_projector(request, model)
    finally:
        handler.cleanup()


@csrf_protect
def _upload_projector(request: HttpRequest, model: LLMModel) -> HttpResponse:
    form = ProjectorUploadForm(request.POST, request.FILES)
    if not form.is_valid():
        messages.error(request, next(iter(form.errors.values()))[0])
        return redirect("model-detail", name=model.name)
    uploaded = form.cleaned_data["file"]
    try:
        check_projector(read_gguf(uploaded.temporary_file_path()), model.embedding_length)
    except GGUFError as exc:
        messages.error(request, flash_text(f"{uploaded.name} was not added: {exc}"))
        return redirect("model-detail", name=model.name)
    target = free_path(safe_filename(uploaded.name))
    os.replace(uploaded.temporary_file_path(), target)  # same directory: atomic
    try:
        projector = register_projector(target, source=LLMModel.Source.UPLOAD,
                                       n_embd=model.embedding_length)  # fmt: skip
        check_projector_for(model, projector)
    except Exception as exc:
        target.unlink(missing_ok=True)  # no file without its record
        messages.error(request, flash_text(f"{uploaded.name} was not added: "
                                           f"{getattr(exc, 'message', exc)}"))  # fmt: skip
        return redirect("model-detail", name=model.name)
    model.projector = projector
    found, _ = operations.estimate(model)
    model.estimated_bytes = found.total_bytes if found else None
    model.load_settings_changed_at = timezone.now()
    model.save(update_fields=["projector", "estimated_bytes", "load_settings_changed_at"])
    messages.success(request, f"{model.name} takes images now, with {projector.file_name}; it "
                              "applies when it loads.")  # fmt: skip
    return redirect("model-detail", name=model.name)


@csrf_protect
def _upload(request: HttpRequest) -> HttpResponse:
    form = UploadForm(request.POST, request.FILES)
    if not form.is_valid():
        first = next(iter(form.errors.values()))[0]
        return _upload_refused(request, first, 400)
    uploaded = form.cleaned_data["file"]
    try:
        model = install_file(
            uploaded.temporary_file_path(), safe_filename(uploaded.name),
            source=LLMModel.Source.UPLOAD, name=form.cleaned_data["name"] or None,
        )  # fmt: skip
    except GGUFError as exc:
        said = plain.explain(exc)
        return _upload_refused(
            request, f"{uploaded.name} is not a usable GGUF file: {said.sentence}", 400,
            detail=said.detail,
        )  # fmt: skip
    except AlreadyRegistered as exc:  # one entry per file: point at the one that holds it
        url = reverse("model-detail", args=[exc.model.name])
        if wants_json(request):
            return JsonResponse({"error": f"{uploaded.name}: {exc}", "existing": exc.model.name,
                                 "existing_url": url}, status=409)  # fmt: skip
        messages.info(request, f"{uploaded.name} was not added: {exc}. Here it is.")
        return redirect(url)
    except ImportRefused as exc:
        return _upload_refused(request, str(exc), 400)
    job = tasks.schedule_hash(model)
    url = reverse("model-detail", args=[model.name])
    if wants_json(request):
        return JsonResponse({"name": model.name, "url": url, "hash_job": job.id}, status=201)
    messages.success(request, f"Uploaded {model.name}; its sha256 is being computed.")
    return redirect(url)


def _upload_refused(request: HttpRequest, message: str, status: int,
                    detail: str = "") -> HttpResponse:  # fmt: skip
    if wants_json(request):
        return JsonResponse({"error": message, "detail": detail}, status=status)
    messages.error(request, flash_text(f"Upload refused: {message}\n{detail}".strip()))
    return redirect("models")


@staff_required
@require_POST
def download(request: HttpRequest) -> HttpResponse:
    form = DownloadForm(request.POST)
    if not form.is_valid():
        message = form.errors["url"][0]
        if wants_json(request):
            return JsonResponse({"error": message}, status=400)
        messages.error(request, f"Download refused: {message}")
        return redirect("models")
    job = Job.objects.create(kind=Job.Kind.DOWNLOAD, source=form.cleaned_data["url"],
                             message="waiting to start")  # fmt: skip
    dispatch(tasks.download_model, job.id)
    if wants_json(request):
        return JsonResponse(job_json(job), status=202)
    messages.info(request, f"Downloading {job.shown_source}: progress below.")
    return redirect("models")


@staff_required
@require_POST
def job_cancel(request: HttpRequest, pk: int) -> HttpResponse:
    job = get_object_or_404(Job, pk=pk)
    cancelled = cancel_job(job)
    if wants_json(request):
        job.refresh_from_db()
        return JsonResponse(job_json(job), status=200 if cancelled else 409)
    if cancelled:
        messages.info(request, f"Job {job.id} cancelled.")
    else:
        messages.warning(request, f"Job {job.id} had already ended.")
    return redirect("models")


@staff_required
@require_POST
def job_retry(request: HttpRequest, pk: int) -> HttpResponse:
    """Run a failed or cancelled job again: the same row, the same source."""
    job = get_object_or_404(Job, pk=pk)
    retried = tasks.retry(job)
    if wants_json(request):
        job.refresh_from_db()
        return JsonResponse(job_json(job), status=202 if retried else 409)
    if retried:
        messages.info(request, f"Job {job.id} ({job.kind}) started again: progress below.")
    else:
        messages.warning(request, f"Job {job.id} cannot be retried: it has not failed, or a "
                                  f"{job.kind} job cannot run again.")  # fmt: skip
    return redirect("models")


@staff_required
@require_POST
def job_dismiss(request: HttpRequest, pk: int) -> HttpResponse:
    """Hide an ended job from the list (its row stays, for the record)."""
    job = get_object_or_404(Job, pk=pk)
    dismissed = dismiss_job(job)
    if wants_json(request):
        return JsonResponse({"id": job.id, "dismissed": dismissed}, status=200 if dismissed
                            else 409)  # fmt: skip
    if not dismissed:
        messages.warning(request, f"Job {job.id} is still running: cancel it first.")
    return redirect("models")


@staff_required
@require_POST
def make_default(request: HttpRequest, name: str) -> HttpResponse:
    model = get_object_or_404(LLMModel, name=name)
    set_default(model)
    messages.success(request, f"{model.name} is now the default model.")
    return redirect("model-detail", name=model.name)


async def _model_or_404(name: str) -> LLMModel:
    model = await LLMModel.objects.for_serving().filter(name=name).afirst()
    if model is None:
        raise Http404(f"no model named {name!r}")
    return model


@staff_required
@require_POST
async def load(request: HttpRequest, name: str) -> HttpResponse:
    model = await _model_or_404(name)
    try:
        row = await operations.load(model)
    except Exception as exc:  # noqa: BLE001 - every refusal is shown: GGUFError, memory, busy
        log.info("load of %s refused: %s", model.name, exc)
        messages.error(request, flash_text(plain.message(exc, f"{model.name} was not loaded: ")))
    else:
        took = f" in {row['load_seconds']:.1f} s" if row and row.get("load_seconds") else ""
        messages.success(request, f"{model.name} is loaded{took}.")
    return redirect("model-detail", name=model.name)


@staff_required
@require_POST
async def apply(request: HttpRequest, name: str) -> HttpResponse:
    """Save and reload: save the settings form, then, when a load-time setting changed and the
    model is loaded, reload it with them in the same click (refused, settings kept, while it
    answers: the page then offers to reload when its answers end)."""
    model = await _model_or_404(name)
    saved = await sync_to_async(_save_settings)(request, model)
    if isinstance(saved, HttpResponse):
        return saved  # the page with the form's errors
    model, changed = saved
    if not changed:
        messages.success(request, f"Settings of {model.name} saved; they apply to its next "
                                  "answer (nothing needed a reload).")  # fmt: skip
        return redirect("model-detail", name=model.name)
    await _reload(request, model, wait_s=0.0, saved=True)
    return redirect("model-detail", name=model.name)


def _save_settings(request: HttpRequest, model: LLMModel):
    """(model, load-time settings changed?) once saved, or the page with the form's errors."""
    form = views.settings_form(model, request.POST)
    if not form.is_valid():
        model.refresh_from_db()
        return views.detail_page(request, model, form, status=400)
    return views.save_settings(form), bool(form.load_fields_changed)


@staff_required
@require_POST
async def reload(request: HttpRequest, name: str) -> HttpResponse:
    """Reload now (or, with wait=1, once its answers have ended) to apply saved settings."""
    model = await _model_or_404(name)
    wait = readings.RELOAD_WAIT_S if request.POST.get("wait") == "1" else 0.0
    await _reload(request, model, wait_s=wait, saved=False)
    return redirect("model-detail", name=model.name)


async def _reload(request: HttpRequest, model: LLMModel, *, wait_s: float, saved: bool) -> None:
    first = f"Settings of {model.name} saved" if saved else model.name
    try:
        row = await operations.reload(model, wait_s=wait_s)
    except operations.OperationRefused as exc:
        waited = f" within {wait_s:.0f} s" if wait_s else ""
        messages.warning(request, f"{first}; {exc}{waited}. Use “Reload when its answers end”, "
                                  "or reload it later: they apply at its next load.")  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - the new settings may not fit, or the file broke
        log.info("reload of %s refused: %s", model.name, exc)
        messages.error(request, flash_text(plain.message(
            exc, f"{first}; it was unloaded, but loading it again was refused: ")))  # fmt: skip
    else:
        if row is None:
            messages.success(request, f"{first}; it is not loaded, so they apply when it loads.")
        else:
            took = f" in {row['load_seconds']:.1f} s" if row.get("load_seconds") else ""
            messages.success(request, f"{first} and applied: reloaded{took}.")


@staff_required
@require_POST
async def unload(request: HttpRequest, name: str) -> HttpResponse:
    model = await _model_or_404(name)
    try:
        unloaded = await operations.unload(model)
    except Exception as exc:  # noqa: BLE001 - busy, or a worker that refused
        messages.error(request, f"{model.name} was not unloaded: {exc}")
    else:
        messages.info(request, f"{model.name} unloaded." if unloaded
                      else f"{model.name} was not loaded.")  # fmt: skip
    return redirect("model-detail", name=model.name)


@staff_required
@require_POST
async def forget_prompts(request: HttpRequest, name: str) -> HttpResponse:
    """Forget every prompt kept for the model (warm memory), on every box: the next request
    for each of them reads its prompt again."""
    model = await _model_or_404(name)
    if model.base_id:  # it loads as its base: the prompts kept are the base's
        base = await LLMModel.all_objects.aget(pk=model.base_id)
        messages.warning(request, f"{model.name}'s cached prompts are {base.name}'s: forget "
                                  f"them on {base.name}'s page.")  # fmt: skip
        return redirect("model-detail", name=model.name)
    try:
        forgotten = await operations.forget_kept_prompts(model)
    except Exception as exc:  # noqa: BLE001 - a worker that refused or did not answer
        log.info("forgetting the cached prompts of %s failed: %s", model.name, exc)
        messages.error(request, f"The cached prompts of {model.name} were not forgotten: {exc}")
    else:
        if forgotten:
            plural = "" if forgotten == 1 else "s"
            messages.success(request, f"Forgot {forgotten} cached prompt{plural} of {model.name}.")
        else:
            messages.info(request, f"{model.name} had no cached prompts to forget.")
    return redirect("model-detail", name=model.name)


@staff_required
@require_http_methods(["GET", "POST"])
async def delete(request: HttpRequest, name: str) -> HttpResponse:
    """GET: the confirmation page; POST: unload if idle, then unregister (and remove the file
    when it lives in the models directory)."""
    model = await _model_or_404(name)
    if request.method == "GET":
        return await sync_to_async(_confirm_delete)(request, model)
    try:
        outcome = await operations.delete(model)
    except (operations.OperationRefused, OSError) as exc:
        messages.error(request, f"{model.name} was not deleted: {exc}")
        return redirect("model-detail", name=model.name)
    messages.success(request, outcome + ".")
    return redirect("models")


def _confirm_delete(request: HttpRequest, model: LLMModel) -> HttpResponse:
    response = render(request, "model_pages/confirm_delete.html", {
        "model": model,
        "packaged": is_packaged(model),
        "removes_file": not is_packaged(model) and inside_models_dir(model.file_path),
        "loaded": operations.loaded_rows(readings.snapshots()).get(model.name),
    })  # fmt: skip
    response["Content-Security-Policy"] = content_security_policy(request)
    return response
