"""The model pages under /models/ and their JSON: every logged-in user may look;
only staff change (the settings form here, everything else in dashboard.model_pages.actions).
"""

import os
import shutil
import time
from typing import TypedDict

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods

from dashboard.model_pages import copy_to_box, readings
from dashboard.model_pages.display import bytes_label, params_label, seconds_label
from dashboard.model_pages.forms import (
    DeriveForm,
    DownloadForm,
    ModelSettingsForm,
    OwnSettingsForm,
    UploadForm,
)
from dashboard.web.health import UNUSABLE_STATES
from dashboard.web.panels import PromptCachePanel, TierPanel
from dashboard.web.security import with_csp
from inference.catalog import operations
from inference.catalog.importing import copies, models_dir
from inference.catalog.specs import spec_for
from inference.engine.params import usable_defaults
from inference.jobs import plain
from inference.jobs.tasks import RETRY_TASKS
from inference.models import Job, LLMModel
from inference.planning.memory import MemoryEstimate

RECENT_JOBS = 20


def wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")


@login_required
@require_GET
@with_csp
def model_list(request: HttpRequest) -> HttpResponse:
    snaps = readings.snapshots()
    loaded = {name: loaded_view(row) for name, row in operations.loaded_rows(snaps).items()}
    models = list(LLMModel.objects.select_related("base"))
    same = copies(models)
    rows = [{
        "model": m,
        "params": params_label(m.parameter_count),
        "size": bytes_label(m.size_bytes),
        "estimate": bytes_label(m.estimated_bytes) if m.estimated_bytes else "?",
        "loaded": loaded.get(m.name),
        "file_missing": not os.path.isfile(m.weights.file_path),
        "copies": same.get(m.pk, []),
    } for m in models]  # fmt: skip
    return render(request, "model_pages/models.html", {
        "rows": rows,
        "loaded": sorted(loaded.values(), key=lambda r: r["name"]),
        "loading": readings.loading_names(snaps),
        "memory": memory_view(readings.memory(snaps)),
        "jobs": [job_view(job) for job in recent_jobs()],
        "upload_form": UploadForm(),
        "download_form": DownloadForm(),
        "derive_form": DeriveForm(),
        "models_dir": models_dir(),
        "disk_free": bytes_label(shutil.disk_usage(models_dir()).free),
    })  # fmt: skip


@login_required
@require_http_methods(["GET", "POST"])
@with_csp
def model_detail(request: HttpRequest, name: str) -> HttpResponse:
    found = LLMModel.objects.select_related("base", "projector", "base__projector")
    model = get_object_or_404(found, name=name)
    if request.method == "GET":
        return detail_page(request, model, settings_form(model))
    if not request.user.is_staff:
        raise PermissionDenied
    form = settings_form(model, request.POST)
    if not form.is_valid():
        model.refresh_from_db()  # the page shows the saved settings next to the form's errors
        return detail_page(request, model, form, status=400)
    model = save_settings(form)
    row = operations.loaded_rows(readings.snapshots()).get(model.name)
    if model.base_id:
        note = "they apply to its next answer"
    elif row is None:
        note = "they apply when it loads"
    elif form.load_fields_changed:
        note = "it is loaded with the earlier ones: “Reload to apply” below applies them"
    else:
        note = "they apply to its next answer"
    messages.success(request, f"Settings of {model.name} saved; {note}.")
    return redirect("model-detail", name=model.name)


def settings_form(model: LLMModel, data=None) -> OwnSettingsForm:
    """The settings a model's page edits: a derived model's own (its load settings are its
    base's), else its load settings too."""
    return (OwnSettingsForm if model.base_id else ModelSettingsForm)(data, instance=model)


def save_settings(form: OwnSettingsForm) -> LLMModel:
    """Save a valid settings form with its estimate, noting when a load-time setting changed."""
    model = form.save(commit=False)
    found, _ = operations.estimate(model)
    model.estimated_bytes = found.total_bytes if found else None
    if form.load_fields_changed:
        model.load_settings_changed_at = timezone.now()
    model.save()
    return model


def detail_page(request: HttpRequest, model: LLMModel, form: OwnSettingsForm,
                status: int = 200) -> HttpResponse:  # fmt: skip
    if model.base_id:
        return derived_page(request, model, form, status)
    snaps = readings.snapshots()
    found, why_not = operations.estimate(model)
    memory = readings.memory(snaps)
    loaded = operations.loaded_rows(snaps).get(model.name)
    runners = [runner_view(r) for r in readings.runner_rows(snaps).get(model.name, [])]
    hash_job = (
        Job.objects.filter(model=model, kind=Job.Kind.HASH,
                           state__in=[Job.State.PENDING, Job.State.RUNNING]).first()
    )  # fmt: skip
    if hash_job is None and not model.sha256:
        # The job may have finished since the model was read (it saves the hash, then ends):
        # read the hash again rather than show "not computed" with nothing polling.
        model.refresh_from_db(fields=["sha256"])
    same = copies(list(LLMModel.objects.filter(sha256=model.sha256))) if model.sha256 else {}
    return render(request, "model_pages/detail.html", {
        "model": model,
        "form": form,
        "facts": facts(model),
        "estimate": estimate_view(found, memory, model),
        "estimate_error": plain.split(why_not),
        "verdict": "" if loaded else readings.fit_verdict(found, memory),
        "measured": measured_label(model),
        "memory": memory_view(memory),
        "loaded": loaded_view(loaded) if loaded else None,
        "idle_line": idle_line(model),
        "stale_settings": bool(loaded) and settings_are_newer(model, loaded),
        "loading": readings.loading_names(snaps),
        "runners": runners,
        "kept": kept_lines(readings.kept_prompts(snaps, model.name)),
        "hash_job": hash_job,
        "file_missing": not os.path.isfile(model.weights.file_path),
        "copies": same.get(model.pk, []),
        # Split mode: the inference workers and this model's file on each (None: one box).
        "boxes": copy_to_box.boxes_for(model) if copy_to_box.other_boxes() else None,
        "keys": sorted((model.metadata or {}).get("keys", {}).items()),
    }, status=status)  # fmt: skip


def derived_page(request: HttpRequest, model: LLMModel, form: OwnSettingsForm,
                 status: int) -> HttpResponse:  # fmt: skip
    """A derived model's page: its own settings; its base's load state, which is its own (it
    loads as its base), and a link to the base for everything about the weights."""
    snaps = readings.snapshots()
    base = model.base
    loaded = operations.loaded_rows(snaps).get(base.name)
    return render(request, "model_pages/derived.html", {
        "model": model,
        "base": base,
        "form": form,
        "sampling": sorted(usable_defaults(model.default_params).items()),
        "loaded": loaded_view(loaded) if loaded else None,
        "idle_line": f"Not loaded: it loads as {base.name} on its first request.",
        "loading": readings.loading_names(snaps),
    }, status=status)  # fmt: skip


def settings_are_newer(model: LLMModel, row: dict) -> bool:
    """A load-time setting changed after the loaded engine was loaded: it runs older ones."""
    changed = model.load_settings_changed_at
    return changed is not None and changed.timestamp() > float(row.get("loaded_at") or 0)


def measured_label(model: LLMModel) -> str:
    """What the last load from the Load button took (loads for a request are not measured)."""
    if not model.measured_bytes:
        return "not measured yet: a load with the Load button measures it"
    took = f" in {model.last_load_seconds:.2f} s" if model.last_load_seconds else ""
    return f"{bytes_label(model.measured_bytes)}{took}"


def idle_line(model: LLMModel) -> str:
    """The load-state line of a model that is not loaded."""
    return "Not loaded: it loads on its first request, or now with Load."


def loaded_view(row: dict) -> dict:
    """A loaded row worded: the one source of a model's load state on both pages and in their
    live refresh (the inference client's snapshot; the database says nothing about it)."""
    expires = "busy" if row.get("busy") else seconds_label(row.get("expires_in"))
    size = bytes_label(row.get("size_bytes"))
    ago = seconds_label(time.time() - float(row.get("loaded_at") or time.time()))
    ctx = row.get("ctx_per_seq")
    worker = row.get("worker") or ""
    # In split mode the worker that holds it matters; embedded, it is this box.
    where = f" on {worker}" if worker and worker != "embedded" else ""
    parts = [f"Loaded{where} {ago} ago"]
    if row.get("load_seconds"):
        parts[0] += f" (the load took {row['load_seconds']:.1f} s)"
    parts.append(f"{size} mapped" + (f", {ctx} tokens per sequence" if ctx else ""))
    draft = row.get("draft_model")
    if draft and draft.get("problem"):
        parts.append(f"its draft model is not used: {draft['problem']}")
    elif draft:
        parts.append(f"drafting with {os.path.basename(draft.get('path') or '')}")
    parts.append("answering now" if row.get("busy") else f"unloads in {expires} if idle")
    return {**row, "size_label": size, "expires_label": expires, "summary": "; ".join(parts) + "."}


class RunnerView(TypedDict):
    """A model's runner process in plain words, for the page and its live refresh."""

    worker: str
    state: str
    usable: bool
    summary: str
    restarts: int
    last_exit: str  # "" when it never exited
    wait: str  # "" unless backing off
    note: str  # the CPU self-check's finding, "" when it changed nothing


RUNNER_SUMMARIES = {
    "starting": "starting: the model is loading in it",
    "stopped": "stopped: the model was unloaded",
    "crashed": "crashed: the next request starts it again",
    "failed": "failed: its last start did not load the model",
}


def runner_view(row: readings.RunnerRow) -> RunnerView:
    state = row["state"]
    if state == "running":
        summary = f"running (pid {row['pid']})" if row["pid"] is not None else "running"
    elif state == "backing off":
        summary = (
            f"backing off: it crashed {row['crashes_in_a_row']} times in a row, so requests for"
            " this model are refused for a while rather than crash it again"
        )
    else:
        summary = RUNNER_SUMMARIES.get(state, state)
    last_exit = row["last_exit"] or ""
    if last_exit and row["last_exit_ago"] is not None:
        last_exit = f"{last_exit}, {seconds_label(row['last_exit_ago'])} ago"
    wait = ""
    if state == "backing off":
        wait = (
            f"the next start is allowed in {seconds_label(row['retry_in'])}"
            if row["retry_in"] is not None
            else "the next start is allowed now"
        )
    return {
        "worker": row["worker"],
        "state": state,
        "usable": state not in UNUSABLE_STATES,
        "summary": summary,
        "restarts": row["restarts"],
        "last_exit": last_exit,
        "wait": wait,
        "note": row["note"],
    }


def memory_view(memory: readings.Memory | None) -> dict | None:
    if memory is None:
        return None
    return {
        "ram_free": bytes_label(memory.ram_free), "ram_total": bytes_label(memory.ram_total),
        "gpu_free": bytes_label(memory.gpu_free) if memory.gpu_free is not None else "",
        "gpu_total": bytes_label(memory.gpu_total) if memory.gpu_total is not None else "",
        "worker": bytes_label(memory.worker_bytes),
        "gpus": [{**g, "used": bytes_label(g.get("used_bytes")),
                  "total": bytes_label(g.get("total_bytes")),
                  "own": bytes_label(g.get("process_bytes"))} for g in memory.gpus],
    }  # fmt: skip


def estimate_view(found: MemoryEstimate | None, memory: readings.Memory | None,
                  model: LLMModel) -> dict | None:  # fmt: skip
    if found is None:
        return None
    return {
        "kv_line": kv_line(found, model),
        "weights": bytes_label(found.weights_bytes),
        "kv_cache": bytes_label(found.kv_cache_bytes),
        "compute": bytes_label(found.compute_bytes),
        "total": bytes_label(found.total_bytes),
        "gpu": bytes_label(found.gpu_bytes) if found.gpu_layers else "",
        "cpu": bytes_label(found.cpu_bytes),
        "gpu_layers": found.gpu_layers,
        "n_layers": found.n_layers,
        "n_ctx_total": found.n_ctx_total,
        "kv_type": found.kv_type,
        "uses_gpu": bool(memory and memory.gpu_free is not None and found.gpu_layers),
        "fitted": found.reason,  # what the load's fit chose for these settings, and why
    }


def kv_line(found: MemoryEstimate, model: LLMModel) -> str:
    """Where the KV cache's size comes from: every sequence slot holds a context of its own
    (inference.planning.memory); with warm memory on, only the answering ones (finished turns
    go to the RAM and disk tiers when their slot is needed: inference.catalog.specs.kept_slots),
    else those and the prefix cache's."""
    config = spec_for(model).config
    running, cached = config.parallel, config.cache_slots
    slots = running + cached
    per_seq = found.n_ctx_total // slots if slots else found.n_ctx_total
    held = (f"{running} answering at once + {cached} kept for cached conversations" if cached
            else f"{running} answering at once; finished turns are kept in RAM and on disk")
    sequences = "sequence" if slots == 1 else "sequences"
    return (f"{per_seq} tokens per sequence × {slots} {sequences} ({held}) = "
            f"{found.n_ctx_total} tokens, {found.kv_type}")  # fmt: skip


def kept_lines(rows: list[tuple[str, PromptCachePanel]]) -> list[str]:
    """The model's kept prompts in words, one line per worker that has it loaded."""
    if not rows:
        return ["Not loaded: the prompts it keeps on disk wait for its next load."]
    lines = []
    for worker, kept in rows:
        where = f"On {worker}: " if worker and worker != "embedded" else ""
        admitted = sum(kept["admitted"].values())
        found = admitted - kept["admitted"]["miss"]
        use = "No request yet since it loaded."
        if admitted:
            use = f"{found} of {admitted} requests since it loaded found their prompt's start kept"
            use += f", which saved {kept['saved_s']:.1f} s of reading." if kept["saved_s"] else "."
        if not kept["enabled"]:
            lines.append(f"{where}Warm memory is off on this box (PROMPT_CACHE_RAM=0): finished "
                         f"turns stay only in their sequence slots. {use}")  # fmt: skip
            continue
        tiers = [f"in RAM {tier_label(kept['ram'])}"]  # type: ignore[arg-type]
        tiers.append(f"on disk {tier_label(kept['disk'])}" if kept["disk"] else "no disk tier")
        # A load with a smaller context (or a damaged file) drops what it cannot restore.
        dropped = f" At load it {kept['disk_note']}." if kept["disk_note"] else ""
        lines.append(f"{where}Kept {', '.join(tiers)}.{dropped} {use}")
    return lines


def tier_label(tier: TierPanel) -> str:
    plural = "" if tier["entries"] == 1 else "s"
    return (f"{bytes_label(tier['bytes'])} of {bytes_label(tier['bound'])} "
            f"({tier['entries']} prompt{plural})")  # fmt: skip


def facts(model: LLMModel) -> list[tuple[str, str]]:
    """What the GGUF header says, in the order people look for it."""
    meta = model.metadata or {}
    shown = lambda value: "?" if value in (None, "") else str(value)  # noqa: E731
    return [
        ("Architecture", shown(model.architecture)),
        ("Name in the file", shown(meta.get("name"))),
        ("Parameters", f"{params_label(model.parameter_count)} ({shown(model.parameter_count)})"),
        ("Quantisation", shown(model.quantization)),
        ("Context length", shown(model.context_length)),
        ("Layers", shown(model.layer_count)),
        ("Embedding size", shown(model.embedding_length)),
        ("Attention heads", f"{shown(model.head_count)} (KV heads {shown(model.head_count_kv)})"),
        ("Tokenizer", f"{shown(model.tokenizer)}, vocabulary {shown(meta.get('vocab_size'))}"),
        ("BOS / EOS", f"{shown(meta.get('bos_token'))} / {shown(meta.get('eos_token'))}"),
        ("License", shown(model.license)),
        ("File", model.weights.file_path),
        ("File size", f"{bytes_label(model.size_bytes)} ({model.size_bytes} bytes)"),
        ("Projector", projector_label(model)),
        ("GGUF version", shown(meta.get("gguf_version"))),
        ("Tensors", shown(meta.get("tensor_count"))),
        ("Source", model.get_source_display()),
    ]


def projector_label(model: LLMModel) -> str:
    """The vision projector its weights load with, or that it takes no images."""
    projector = model.weights.projector
    if projector is None:
        return "none: it takes text only"
    return (f"{projector.file_path}: {projector.projector_type}, images of "
            f"{projector.image_size} px in {projector.patch_size} px patches, "
            f"{bytes_label(projector.size_bytes)}, sha256 {projector.sha256 or 'not computed'}")


@login_required
@require_GET
def status(request: HttpRequest) -> JsonResponse:
    """What the pages refresh live: loads under way, loaded models, their runner processes,
    memory, recent jobs."""
    snaps = readings.snapshots()
    memory = readings.memory(snaps)
    return JsonResponse({
        "loading": readings.loading_names(snaps),
        "loaded": sorted((loaded_view(r) for r in operations.loaded_rows(snaps).values()),
                         key=lambda r: r["name"]),  # fmt: skip
        "runners": {name: [runner_view(r) for r in rows]
                    for name, rows in readings.runner_rows(snaps).items()},
        "memory": None if memory is None else {
            "ram_free": memory.ram_free, "ram_total": memory.ram_total,
            "gpu_free": memory.gpu_free, "gpu_total": memory.gpu_total,
            "worker_bytes": memory.worker_bytes,
        },
        "jobs": [job_json(job) for job in recent_jobs()],
    })  # fmt: skip


@login_required
@require_GET
def job_status(request: HttpRequest, pk: int) -> JsonResponse:
    return JsonResponse(job_json(get_object_or_404(Job.objects.select_related("model"), pk=pk)))


def recent_jobs() -> list[Job]:
    return list(Job.objects.filter(dismissed=False).select_related("model")[:RECENT_JOBS])


def job_view(job: Job) -> dict:
    """A job row as the page shows it: its message's sentence, the detail folded, and what the
    staff may do with it."""
    said = plain.split(job.message)
    return {
        "job": job,
        "sentence": said.sentence,
        "detail": said.detail,
        "can_cancel": job.state in (Job.State.PENDING, Job.State.RUNNING),
        "can_retry": retryable(job),
        "can_dismiss": job.state in (Job.State.DONE, Job.State.FAILED, Job.State.CANCELLED),
    }


def retryable(job: Job) -> bool:
    """As inference.jobs.tasks.retry decides: failed or cancelled, of a kind that runs again."""
    if job.state not in (Job.State.FAILED, Job.State.CANCELLED) or job.kind not in RETRY_TASKS:
        return False
    return job.kind != Job.Kind.HASH or job.model_id is not None


def job_json(job: Job) -> dict:
    model = job.model
    view = job_view(job)
    return {
        "id": job.id,
        "kind": job.kind,
        "state": job.state,
        "progress": job.progress,
        "message": view["sentence"],
        "detail": view["detail"],
        "can_cancel": view["can_cancel"],
        "can_retry": view["can_retry"],
        "can_dismiss": view["can_dismiss"],
        "source": job.shown_source,
        "model": model.name if model else None,
        "model_url": reverse("model-detail", args=[model.name]) if model and not model.hidden
        else None,
        "sha256": model.sha256 if model else None,
        "updated_at": job.updated_at.isoformat(),
    }  # fmt: skip
