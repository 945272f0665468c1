"""Load, unload and delete from the pages, through the inference client, and what the pages read
from the workers' snapshots: what is loaded, what is loading, the live memory.

A load is measured where it happens: the worker's RSS plus its own GPU memory, read from its
snapshot before and after, is what the load actually took (LLMModel.measured_bytes), shown next
to the estimate.
"""

import asyncio
import time
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.utils import timezone

from dashboard.web.panels import RunnerPanel, runner_panel
from inference import creating, plain
from inference.catalog import spec_for
from inference.gguf import GGUFError
from inference.importing import unregister
from inference.memory import AvailableMemory, InsufficientMemory, MemoryEstimate, check_fits
from inference.models import LLMModel
from inference.preflight import estimate_for_settings, gguf_info
from inference.serving.client import get_client


class Refused(Exception):
    """An action the page cannot do now; the message says why."""


# "Reload when its answers end": how long the page's request waits, and how often it looks.
RELOAD_WAIT_S = 120.0
RELOAD_POLL_S = 0.25


# 1. Readings from the snapshots.


def snapshots() -> list[dict]:
    return get_client().snapshots()


def loaded_rows(snaps: list[dict]) -> dict[str, dict]:
    """Model name -> its `ollama ps` row, with the worker that holds it."""
    rows = {}
    for snap in snaps:
        for row in snap.get("loaded") or []:
            rows[row["name"]] = {**row, "worker": snap.get("worker", "")}
    return rows


class RunnerRow(RunnerPanel):
    worker: str


def runner_rows(snaps: list[dict]) -> dict[str, list[RunnerRow]]:
    """Model name -> its runner process on each worker that has had one (in split mode a model
    may have run on several), read as the dashboard reads them."""
    rows: dict[str, list[RunnerRow]] = {}
    for snap in snaps:
        raw_rows = snap.get("runners")
        at = snap.get("time")
        at = float(at) if isinstance(at, int | float) and not isinstance(at, bool) else 0.0
        for raw in raw_rows if isinstance(raw_rows, list) else []:
            if not isinstance(raw, dict):
                continue
            row = runner_panel(raw, at)
            if row["model"]:
                worker = str(snap.get("worker") or "")
                rows.setdefault(row["model"], []).append(RunnerRow(**row, worker=worker))
    return rows


def loading_names(snaps: list[dict]) -> list[str]:
    return [snap["loading"] for snap in snaps if snap.get("loading")]


def process_bytes(snap: dict) -> int:
    """A worker's own memory: RSS plus what it holds on every GPU."""
    system = snap.get("system") or {}
    gpu = sum(g.get("process_bytes") or 0 for g in system.get("gpus") or [])
    return int(system.get("rss_bytes") or 0) + int(gpu)


@dataclass(frozen=True, slots=True)
class Memory:
    """Free and total memory of the first worker's box (embedded: this one)."""

    ram_free: int | None
    ram_total: int | None
    gpu_free: int | None
    gpu_total: int | None
    worker_bytes: int
    gpus: list[dict]

    @property
    def available(self) -> AvailableMemory:
        return AvailableMemory(ram_bytes=self.ram_free, gpu_bytes=self.gpu_free)


def memory(snaps: list[dict]) -> Memory | None:
    if not snaps:
        return None
    system = snaps[0].get("system") or {}
    gpus = system.get("gpus") or []
    return Memory(
        ram_free=system.get("ram_available_bytes"),
        ram_total=system.get("ram_total_bytes"),
        gpu_free=sum(g["total_bytes"] - g["used_bytes"] for g in gpus) if gpus else None,
        gpu_total=sum(g["total_bytes"] for g in gpus) if gpus else None,
        worker_bytes=process_bytes(snaps[0]),
        gpus=gpus,
    )


# 2. Estimates.


def estimate(model: LLMModel) -> tuple[MemoryEstimate | None, str]:
    """The estimate for the model's current settings, or None and why not."""
    try:
        info = gguf_info(model.weights.file_path)
    except GGUFError as exc:
        return None, plain.message(exc)  # its sentence, then the reader's detail
    found = estimate_for_settings(
        info, ctx_per_seq=model.n_ctx, parallel=model.parallel, kv_type=model.kv_type,
        n_gpu_layers=model.n_gpu_layers, n_batch=model.n_batch, n_ubatch=model.n_ubatch,
    )  # fmt: skip
    return found, "" if found else "the file's metadata does not say enough to size it"


def fit_verdict(found: MemoryEstimate | None, free: Memory | None) -> str:
    """Empty when it fits, else InsufficientMemory's message with the numbers."""
    if found is None or free is None:
        return ""
    try:
        check_fits(found, free.available)
    except InsufficientMemory as exc:
        return str(exc)
    return ""


# 3. Actions.


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
                    raise Refused(f"{model.name} could not be unloaded: {exc}") from exc
        if time.monotonic() >= deadline:
            raise Refused(f"{model.name} is answering a request, so it was not reloaded")
        await asyncio.sleep(RELOAD_POLL_S)
    fresh = await LLMModel.objects.aget(pk=model.pk)
    return await load(fresh)


async def unload(model: LLMModel) -> bool:
    """True if a worker unloaded it; ModelBusy (or the client's refusal) while it answers."""
    return await get_client().unload(model.name)


async def delete(model: LLMModel) -> str:
    """Unload if loaded and idle, then unregister (inference.importing.unregister decides what
    happens to the file). Refused while the model answers a request, and for weights a derived
    model uses. A derived model goes alone: its base's engine and file stay."""
    if model.base_id:
        return await sync_to_async(creating.forget)(model)
    users = await sync_to_async(creating.derived_of)(model)
    if users:
        raise Refused(f"{model.name}'s weights serve the derived models {', '.join(users)}; "
                      "delete those first")  # fmt: skip
    client = get_client()
    row = loaded_rows(await sync_to_async(client.snapshots)()).get(model.name)
    if row is not None:
        if row.get("busy"):
            raise Refused(f"{model.name} is answering a request; delete it when it is idle")
        try:
            await client.unload(model.name)
        except Exception as exc:  # noqa: BLE001 - busy meanwhile, or a worker refused
            raise Refused(f"{model.name} could not be unloaded: {exc}") from exc
    return await sync_to_async(unregister)(model)
