"""What the model pages read from the workers' snapshots: what is loaded, what is loading, each
model's runner processes and kept prompts, the live memory, and whether an estimate fits in
it. The operations the pages run (load, unload, delete) are inference.catalog.operations, which
the API shares.
"""

from dataclasses import dataclass

from dashboard.web.panels import PromptCachePanel, RunnerPanel, prompt_cache_panel, runner_panel
from inference.catalog.operations import process_bytes
from inference.planning.machine import free_gpu_bytes
from inference.planning.memory import (
    AvailableMemory,
    InsufficientMemory,
    MemoryEstimate,
    check_fits,
)
from inference.serving.client import get_client

# "Reload when its answers end": how long the page's request waits.
RELOAD_WAIT_S = 120.0


def snapshots() -> list[dict]:
    return get_client().snapshots()


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


def kept_prompts(snaps: list[dict], name: str) -> list[tuple[str, PromptCachePanel]]:
    """(worker, its warm memory) for each worker that has the model loaded, read as the
    dashboard reads it; [] when none has (the prompts kept on disk wait for its next load)."""
    rows = []
    for snap in snaps:
        engines = snap.get("models")
        engine = engines.get(name) if isinstance(engines, dict) else None
        panel = prompt_cache_panel(engine.get("prompt_cache")) if isinstance(engine, dict) else None
        if panel is not None:
            rows.append((str(snap.get("worker") or ""), panel))
    return rows


def loading_names(snaps: list[dict]) -> list[str]:
    return [snap["loading"] for snap in snaps if snap.get("loading")]


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
        gpu_free=free_gpu_bytes(gpus),
        gpu_total=sum(g["total_bytes"] for g in gpus) if gpus else None,
        worker_bytes=process_bytes(snaps[0]),
        gpus=gpus,
    )


def fit_verdict(found: MemoryEstimate | None, free: Memory | None) -> str:
    """Empty when it fits, else InsufficientMemory's message with the numbers."""
    if found is None or free is None:
        return ""
    try:
        check_fits(found, free.available)
    except InsufficientMemory as exc:
        return str(exc)
    return ""
