"""The dashboard's Boxes panel: each inference worker, its host, its models (loaded or not, by
the registry's names), its load, runners and free memory.

In split mode a worker's announcement (inference.serving.announcement) says what it has: its
files by sha256, which the web side names from the registry, and its loaded models with their
slots. In embedded mode there is one box, this one: it serves every registered model whose file
is here. Either way the worker's telemetry panels (dashboard.web.panels) add its runners, its
loading model and, where no announcement says, its load and free memory.

The consumer adds a `box` to each worker's panels (dashboard.consumers.TelemetryConsumer);
the registry's names and the announcements are read at most every READ_EVERY_S per process,
not once per snapshot per socket.
"""

import os
import socket
import threading
import time
from typing import TypedDict

from inference.models import LLMModel
from inference.planning.machine import free_gpu_bytes
from inference.serving.announcement import WorkerAnnouncement
from inference.serving.client import get_client

READ_EVERY_S = 1.0


class BoxModel(TypedDict):
    name: str  # the registry's names of the file, joined; an unknown file by its digest
    sha256: str
    loaded: bool
    n_ctx: int | None  # tokens per sequence, when loaded
    slots_total: int | None
    slots_free: int | None


class BoxRunner(TypedDict):
    model: str
    state: str


class BoxPanel(TypedDict):
    worker: str
    host: str
    state: str  # "ready", "loading <model>", "a runner failed"
    models: list[BoxModel]
    running: int  # requests it is answering
    queue_depth: int  # requests waiting on it
    ram_free_bytes: int | None
    vram_free_bytes: int | None  # None: no GPU
    runners: list[BoxRunner]


class _Readings:
    """The registry's names by sha256 and the live announcements, re-read when stale."""

    def __init__(self) -> None:
        self.at = 0.0
        self.names: dict[str, list[str]] = {}
        self.here: list[tuple[str, str]] = []  # (name, sha256) of models whose file is here
        self.announcements: dict[str, WorkerAnnouncement] = {}
        self.lock = threading.Lock()

    def refresh(self) -> None:
        with self.lock:
            if time.monotonic() - self.at < READ_EVERY_S:
                return
            names: dict[str, list[str]] = {}
            here = []
            for name, sha, path in (
                LLMModel.objects.filter(base__isnull=True)
                .order_by("name")
                .values_list("name", "sha256", "file_path")
            ):
                if sha:
                    names.setdefault(sha, []).append(name)
                if os.path.isfile(path):
                    here.append((name, sha))
            found = get_client().announcements()
            self.names, self.here = names, here
            self.announcements = {a.worker: a for a in found}
            self.at = time.monotonic()


_readings = _Readings()


def forget() -> None:
    """Read everything again at the next panel (tests; a model registered a moment ago)."""
    _readings.at = 0.0


def name_of(sha256: str, names: dict[str, list[str]]) -> str:
    known = names.get(sha256)
    return ", ".join(known) if known else f"a file not registered here (sha256 {sha256[:12]}…)"


def _state(panels: dict) -> str:
    if panels.get("loading"):
        return f"loading {panels['loading']}"
    runners = panels.get("runners", [])
    failing = [r["model"] for r in runners if r["state"] in ("backing off", "failed")]
    if failing:
        return "refusing " + ", ".join(failing) + ": its runner failed"
    return "ready"


def box_panel(
    panels: dict, announcement: WorkerAnnouncement | None, names: dict[str, list[str]],
    here: list[tuple[str, str]],
) -> BoxPanel:  # fmt: skip
    """One worker's box from its telemetry panels and, in split mode, its announcement;
    `here`: the models whose file is on this (the web) box, for the embedded mode's one box."""
    memory = panels.get("memory") or {}
    engine_models = panels.get("models") or {}
    models: list[BoxModel] = []
    if announcement is not None:
        loaded = {m.sha256: m for m in announcement.loaded if m.sha256}
        for m in announcement.loaded:
            models.append({
                "name": ", ".join(names.get(m.sha256) or [m.name]), "sha256": m.sha256,
                "loaded": True, "n_ctx": m.n_ctx, "slots_total": m.slots_total,
                "slots_free": m.slots_free,
            })  # fmt: skip
        for served in announcement.serves:
            if served.sha256 not in loaded:
                models.append({"name": name_of(served.sha256, names), "sha256": served.sha256,
                               "loaded": False, "n_ctx": None, "slots_total": None,
                               "slots_free": None})  # fmt: skip
        host = announcement.host
        running, queue_depth = announcement.running, announcement.queue_depth
        ram_free, vram_free = announcement.ram_free_bytes, announcement.vram_free_bytes
    else:
        # No announcement: the embedded mode's one box (this one, with the files here), or a
        # worker that announces nothing (yet): its loaded models only.
        here = here if panels.get("mode") == "embedded" else []
        loaded_names = [row["name"] for row in panels.get("loaded") or []]
        for name in loaded_names:
            engine = engine_models.get(name) or {}
            slots = engine.get("slots") or None
            models.append({
                "name": name, "sha256": next((s for n, s in here if n == name), ""),
                "loaded": True, "n_ctx": None, "slots_total": slots,
                "slots_free": None if slots is None
                else max(0, slots - int(engine.get("active_sequences") or 0)),
            })  # fmt: skip
        models += [
            {"name": name, "sha256": sha, "loaded": False, "n_ctx": None, "slots_total": None,
             "slots_free": None}
            for name, sha in here if name not in loaded_names
        ]  # fmt: skip
        host = socket.gethostname() if panels.get("mode") == "embedded" else ""
        running = int(panels.get("active_sequences") or 0)
        queue_depth = int(panels.get("queue_depth") or 0)
        ram_free = memory.get("ram_available_bytes")
        vram_free = free_gpu_bytes(memory.get("gpus") or [])
    return {
        "worker": str(panels.get("worker") or ""),
        "host": host,
        "state": _state(panels),
        "models": models,
        "running": running,
        "queue_depth": queue_depth,
        "ram_free_bytes": ram_free,
        "vram_free_bytes": vram_free,
        "runners": [{"model": r["model"], "state": r["state"]} for r in panels.get("runners", [])],
    }


def box_for(panels: dict) -> BoxPanel:
    """(Sync: database and Redis reads.) The box of the worker these panels are from."""
    _readings.refresh()
    announcement = _readings.announcements.get(str(panels.get("worker") or ""))
    return box_panel(panels, announcement, _readings.names, _readings.here)
