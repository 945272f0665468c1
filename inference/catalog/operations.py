"""Operations on a registered model that the pages and the API share: load, reload, unload,
delete (and the unregistering under it), make it the default, estimate its memory; and the
beat's idle unload. Each goes through the inference client (inference.serving.client), so it is
the same in embedded and split mode.

A load is measured where it happens: the worker's RSS plus its own GPU memory, read from its
snapshot before and after, is what the load actually took (LLMModel.measured_bytes), shown next
to the estimate. What cannot be done now (a model answering, weights that derived models use)
raises OperationRefused, whose message says why.
"""

import asyncio
import logging
import time
from pathlib import Path

from asgiref.sync import sync_to_async
from django.db import transaction
from django.utils import timezone

from inference.catalog import creating
from inference.catalog.importing import inside_models_dir
from inference.catalog.specs import kept_slots, spec_for
from inference.catalog.starter import packaged_models
from inference.gguf import GGUFError
from inference.jobs import plain
from inference.models import LLMModel
from inference.planning.memory import MemoryEstimate
from inference.planning.preflight import adding_draft, estimate_for_settings, gguf_info
from inference.serving.client import get_client

log = logging.getLogger(__name__)

RELOAD_POLL_S = 0.25  # how often a reload waiting for a model's answers to end looks again


class OperationRefused(Exception):
    """An operation on a model that cannot be done now; the message says why."""


# 1. What the workers' snapshots say about a model.


def loaded_rows(snaps: list[dict]) -> dict[str, dict]:
    """Model name -> its `ollama ps` row, with the worker that holds it."""
    rows = {}
    for snap in snaps:
        for row in snap.get("loaded") or []:
            rows[row["name"]] = {**row, "worker": snap.get("worker", "")}
    return rows


def process_bytes(snap: dict) -> int:
    """A worker's own memory: RSS plus what it holds on every GPU."""
    system = snap.get("system") or {}
    gpu = sum(g.get("process_bytes") or 0 for g in system.get("gpus") or [])
    return int(system.get("rss_bytes") or 0) + int(gpu)


# 2. Estimates.


def estimate(model: LLMModel) -> tuple[MemoryEstimate | None, str]:
    """The estimate for the model's current settings, or None and why not."""
    try:
        info = gguf_info(model.weights.file_path)
    except GGUFError as exc:
        return None, plain.message(exc)  # its sentence, then the reader's detail
    weights = model.weights
    found = estimate_for_settings(
        info, ctx_per_seq=model.n_ctx, parallel=model.parallel, kv_type=model.kv_type,
        n_gpu_layers=model.n_gpu_layers, n_batch=model.n_batch, n_ubatch=model.n_ubatch,
        cache_slots=kept_slots(model.parallel), flash_attn=model.flash_attn,
        mmproj_path=weights.projector.file_path if weights.projector_id else "",
    )  # fmt: skip
    if found is not None and weights.draft_id:
        found = adding_draft(found, weights.draft.weights.file_path,
                             sequences=model.parallel + kept_slots(model.parallel),
                             kv_type=found.kv_type, n_gpu_layers=model.n_gpu_layers)  # fmt: skip
    return found, "" if found else "the file's metadata does not say enough to size it"


# 3. Load, reload, unload, forget its kept prompts, delete.


async def load(model: LLMModel) -> dict | None:
    """Load through the client (refusals raise: GGUFError, InsufficientMemory, ModelBusy, ...)
    and record what the load took. Returns the model's loaded row, when a snapshot has it."""
    client = get_client()
    spec = spec_for(model)
    before_snaps = await sync_to_async(client.snapshots)()
    before = {s.get("worker"): process_bytes(s) for s in before_snaps}
    started = time.time()
    await client.load(spec)
    after_snaps = await sync_to_async(client.snapshots)()
    row = loaded_rows(after_snaps).get(spec.name)
    found, _ = await sync_to_async(estimate)(model)
    updates: dict = {"last_used_at": timezone.now()}
    if found is not None:
        updates["estimated_bytes"] = found.total_bytes
    if row is not None and row.get("loaded_at", 0) >= started:  # this call loaded it
        updates["last_load_seconds"] = row.get("load_seconds")
        after = next((s for s in after_snaps if s.get("worker") == row["worker"]), None)
        if after is not None and row["worker"] in before:
            taken = process_bytes(after) - before[row["worker"]]
            # Negative when the load evicted a bigger model first: no reading to show then.
            updates["measured_bytes"] = taken if taken > 0 else None
    await LLMModel.objects.filter(pk=model.pk).aupdate(**updates)
    return row


async def reload(model: LLMModel, wait_s: float = 0.0) -> dict | None:
    """Apply saved load-time settings to a loaded model: unload it once its answers have ended
    (waiting up to `wait_s`), then load it again from its saved record. Returns the loaded row,
    or None when it was not loaded (its next load uses the settings anyway). Refused when it
    is still answering after `wait_s`: it is never cut off mid-answer."""
    client = get_client()
    deadline = time.monotonic() + wait_s
    while True:
        row = loaded_rows(await sync_to_async(client.snapshots)()).get(model.name)
        if row is None:
            return None
        if not row.get("busy"):
            try:
                await client.unload(model.name)
                break
            except Exception as exc:  # noqa: BLE001 - an answer started meanwhile, or a refusal
                still = loaded_rows(await sync_to_async(client.snapshots)()).get(model.name)
                if not (still and still.get("busy")):
                    raise OperationRefused(f"{model.name} could not be unloaded: {exc}") from exc
        if time.monotonic() >= deadline:
            raise OperationRefused(f"{model.name} is answering a request, so it was not reloaded")
        await asyncio.sleep(RELOAD_POLL_S)
    fresh = await LLMModel.objects.for_serving().aget(pk=model.pk)
    return await load(fresh)


async def unload(model: LLMModel) -> bool:
    """True if a worker unloaded it; ModelBusy (or the client's refusal) while it answers."""
    return await get_client().unload(model.name)


async def forget_kept_prompts(model: LLMModel) -> int:
    """Forget every prompt kept for the model's weights (warm memory: the loaded runner's RAM
    and disk tiers, and the files on disk when it is not loaded), on every box; returns how
    many went. A derived model's are its base's: they are the base's to forget."""
    spec = await sync_to_async(spec_for)(model)
    return await get_client().forget_prompts(model=spec, everything=True)


async def delete(model: LLMModel) -> str:
    """Unload if loaded and idle, forget its kept prompts, then unregister (unregister decides
    what happens to the file). Refused while the model answers a request, and for weights a
    derived model uses. A derived model goes alone: its base's engine, file and kept prompts
    stay."""
    if model.base_id:
        return await sync_to_async(creating.forget)(model)
    users = await sync_to_async(creating.derived_of)(model)
    if users:
        raise OperationRefused(f"{model.name}'s weights serve the derived models "
                               f"{', '.join(users)}; delete those first")  # fmt: skip
    client = get_client()
    row = loaded_rows(await sync_to_async(client.snapshots)()).get(model.name)
    if row is not None:
        if row.get("busy"):
            raise OperationRefused(f"{model.name} is answering a request; delete it when it "
                                   "is idle")  # fmt: skip
        try:
            await client.unload(model.name)
        except Exception as exc:  # noqa: BLE001 - busy meanwhile, or a worker refused
            raise OperationRefused(f"{model.name} could not be unloaded: {exc}") from exc
    try:
        await forget_kept_prompts(model)
    except Exception:  # noqa: BLE001 - a worker away: the delete goes on, its entries stay
        log.warning("%s is deleted, but its kept prompts could not be forgotten", model.name,
                    exc_info=True)  # fmt: skip
    return await sync_to_async(unregister)(model)


# 4. Unregistering, the default model, the idle unload.


def is_packaged(model: LLMModel) -> bool:
    packaged = {str(path.resolve()) for _, path in packaged_models()}
    return model.source == LLMModel.Source.PACKAGE or model.file_path in packaged


def unregister(model: LLMModel) -> str:
    """Remove a model from the catalog; the caller has made sure it is not loaded.

    The file goes too only when it lives inside MODELS_DIR, no package owns it and no other
    entry loads it (the same file with another projector). A packaged model is hidden instead,
    so the next start does not register it again. Its vision projector goes with it, file and
    record, when no other entry uses it. Returns what was done, for the page's message.
    """
    was_default = model.is_default
    projector = model.projector
    shared = LLMModel.all_objects.filter(file_path=model.file_path, base__isnull=True,
                                         hidden=False).exclude(pk=model.pk).first()  # fmt: skip
    if shared is not None:
        model.delete()
        outcome = f"{model.name} deleted; its file stays, {shared.name} loads it"
    elif is_packaged(model):
        model.hidden = True
        model.is_default = False
        model.save(update_fields=["hidden", "is_default"])
        outcome = f"{model.name} removed from the list (its file belongs to a package)"
    elif inside_models_dir(model.file_path):
        Path(model.file_path).unlink(missing_ok=True)  # first: a file that stays keeps its record
        model.delete()
        outcome = f"{model.name} deleted with its file"
    else:
        model.delete()
        outcome = f"{model.name} unregistered; its file outside the models directory stays"
    if projector is not None and not LLMModel.all_objects.filter(projector=projector).exists():
        if inside_models_dir(projector.file_path):
            Path(projector.file_path).unlink(missing_ok=True)
        projector.delete()
    if was_default:
        heir = LLMModel.objects.first()
        if heir is not None:
            LLMModel.objects.filter(pk=heir.pk).update(is_default=True)
    return outcome


def set_default(model: LLMModel) -> None:
    """Make `model` the one default model."""
    with transaction.atomic():
        LLMModel.all_objects.exclude(pk=model.pk).filter(is_default=True).update(is_default=False)
        LLMModel.all_objects.filter(pk=model.pk).update(is_default=True)
    model.is_default = True


def unload_idle_models() -> list[str]:
    """Unload the models whose keep-alive ran out; returns their names. The beat task's body."""
    return get_client().unload_idle()
