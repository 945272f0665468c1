"""The model registry's pages under /models/ and their JSON: every logged-in user may look;
only staff change (the settings form here, everything else in dashboard.registry.actions).
"""

import os
import shutil
from typing import TypedDict

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods

from dashboard.registry import lifecycle
from dashboard.registry.display import bytes_label, params_label, seconds_label
from dashboard.registry.forms import DownloadForm, ModelSettingsForm, UploadForm
from dashboard.web.health import UNUSABLE_STATES
from dashboard.web.security import with_csp
from inference.importing import models_dir
from inference.memory import MemoryEstimate
from inference.models import Job, LLMModel

RECENT_JOBS = 20


def wants_json(request: HttpRequest) -> bool:
    return "application/json" in request.headers.get("Accept", "")


@login_required
@require_GET
@with_csp
def model_list(request: HttpRequest) -> HttpResponse:
    snaps = lifecycle.snapshots()
    loaded = {name: loaded_view(row) for name, row in lifecycle.loaded_rows(snaps).items()}
    rows = [{
        "model": m,
        "params": params_label(m.parameter_count),
        "size": bytes_label(m.size_bytes),
        "estimate": bytes_label(m.estimated_bytes) if m.estimated_bytes else "?",
        "loaded": loaded.get(m.name),
        "file_missing": not os.path.isfile(m.file_path),
    } for m in LLMModel.objects.all()]  # fmt: skip
    return render(request, "registry/models.html", {
        "rows": rows,
        "loaded": sorted(loaded.values(), key=lambda r: r["name"]),
        "loading": lifecycle.loading_names(snaps),
        "memory": memory_view(lifecycle.memory(snaps)),
        "jobs": Job.objects.select_related("model")[:RECENT_JOBS],
        "upload_form": UploadForm(),
        "download_form": DownloadForm(),
        "models_dir": models_dir(),
        "disk_free": bytes_label(shutil.disk_usage(models_dir()).free),
    })  # fmt: skip


@login_required
@require_http_methods(["GET", "POST"])
@with_csp
def model_detail(request: HttpRequest, name: str) -> HttpResponse:
    model = get_object_or_404(LLMModel, name=name)
    if request.method == "POST":
        if not request.user.is_staff:
            raise PermissionDenied
        form = ModelSettingsForm(request.POST, instance=model)
        if form.is_valid():
            model = form.save(commit=False)
            found, _ = lifecycle.estimate(model)
            model.estimated_bytes = found.total_bytes if found else None
            model.save()
            note = ""
            if model.name in lifecycle.loaded_rows(lifecycle.snapshots()):
                note = " They apply at the next load: unload it first."
            messages.success(request, f"Settings of {model.name} saved.{note}")
            return redirect("model-detail", name=model.name)
        model.refresh_from_db()  # the page shows the saved settings next to the form's errors
    else:
        form = ModelSettingsForm(instance=model)

    snaps = lifecycle.snapshots()
    found, why_not = lifecycle.estimate(model)
    memory = lifecycle.memory(snaps)
    loaded = lifecycle.loaded_rows(snaps).get(model.name)
    runners = [runner_view(r) for r in lifecycle.runner_rows(snaps).get(model.name, [])]
    hash_job = (
        Job.objects.filter(model=model, kind=Job.Kind.HASH,
                           state__in=[Job.State.PENDING, Job.State.RUNNING]).first()
    )  # fmt: skip
    if hash_job is None and not model.sha256:
        # The job may have finished since the model was read (it saves the hash, then ends):
        # read the hash again rather than show "not computed" with nothing polling.
        model.refresh_from_db(fields=["sha256"])
    return render(request, "registry/detail.html", {
        "model": model,
        "form": form,
        "facts": facts(model),
        "estimate": estimate_view(found, memory),
        "estimate_error": why_not,
        "verdict": "" if loaded else lifecycle.fit_verdict(found, memory),
        "measured": bytes_label(model.measured_bytes) if model.measured_bytes else "",
        "memory": memory_view(memory),
        "loaded": loaded_view(loaded) if loaded else None,
        "loading": lifecycle.loading_names(snaps),
        "runners": runners,
        "hash_job": hash_job,
        "file_missing": not os.path.isfile(model.file_path),
        "keys": sorted((model.metadata or {}).get("keys", {}).items()),
    }, status=400 if form.errors else 200)  # fmt: skip


def loaded_view(row: dict) -> dict:
    expires = "busy" if row.get("busy") else seconds_label(row.get("expires_in"))
    return {**row, "size_label": bytes_label(row.get("size_bytes")), "expires_label": expires}


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


def runner_view(row: lifecycle.RunnerRow) -> RunnerView:
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


def memory_view(memory: lifecycle.Memory | None) -> dict | None:
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


def estimate_view(found: MemoryEstimate | None, memory: lifecycle.Memory | None) -> dict | None:
    if found is None:
        return None
    return {
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
    }


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
        ("File", model.file_path),
        ("File size", f"{bytes_label(model.size_bytes)} ({model.size_bytes} bytes)"),
        ("GGUF version", shown(meta.get("gguf_version"))),
        ("Tensors", shown(meta.get("tensor_count"))),
        ("Source", model.get_source_display()),
    ]


@login_required
@require_GET
def status(request: HttpRequest) -> JsonResponse:
    """What the pages refresh live: loads under way, loaded models, their runner processes,
    memory, recent jobs."""
    snaps = lifecycle.snapshots()
    memory = lifecycle.memory(snaps)
    return JsonResponse({
        "loading": lifecycle.loading_names(snaps),
        "loaded": sorted(lifecycle.loaded_rows(snaps).values(), key=lambda r: r["name"]),
        "runners": {name: [runner_view(r) for r in rows]
                    for name, rows in lifecycle.runner_rows(snaps).items()},
        "memory": None if memory is None else {
            "ram_free": memory.ram_free, "ram_total": memory.ram_total,
            "gpu_free": memory.gpu_free, "gpu_total": memory.gpu_total,
            "worker_bytes": memory.worker_bytes,
        },
        "jobs": [job_json(job) for job in Job.objects.select_related("model")[:RECENT_JOBS]],
    })  # fmt: skip


@login_required
@require_GET
def job_status(request: HttpRequest, pk: int) -> JsonResponse:
    return JsonResponse(job_json(get_object_or_404(Job.objects.select_related("model"), pk=pk)))


def job_json(job: Job) -> dict:
    model = job.model
    return {
        "id": job.id,
        "kind": job.kind,
        "state": job.state,
        "progress": job.progress,
        "message": job.message,
        "source": job.shown_source,
        "model": model.name if model else None,
        "model_url": reverse("model-detail", args=[model.name]) if model and not model.hidden
        else None,
        "sha256": model.sha256 if model else None,
        "updated_at": job.updated_at.isoformat(),
    }  # fmt: skip
