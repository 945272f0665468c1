"""Which inference worker answers a request (split mode): a pure function of what the workers
announced (inference.serving.announcement), the model asked for, and the worker that served the
request's conversation. No Redis and no Django here: SplitClient reads the announcements and
the affinity, asks `route()`, and publishes to the chosen worker's own queue.

The rules, in order (vLLM's production stack and llm-d route the same way: model, then cached
prefix, then load):
1. The conversation's worker (the last one to claim a turn of it), while it is alive and has the
   model loaded: its KV holds the conversation, so the next turn reads only its new tokens.
   Else a worker with the model loaded that announces the conversation kept (in a slot or one
   of its tiers, inference.engine.tiers): a kept prompt counts like a resident one (reason
   KEPT).
2. A worker with the model loaded, the least loaded first: running and waiting sequences per
   slot. A loaded model stays the one copy, unless all its copies are full (no free slot, and
   requests waiting in their engines) while another worker has the file and room: that worker
   loads a second copy (rule 3's choice, reason SECOND_COPY).
3. A worker that has the file (by sha256; a vision model's projector too) and room for it:
   announced free memory (VRAM where it has a GPU, else RAM) at least the files' size; the
   worker's own preflight (inference.planning.preflight) still checks the whole estimate when
   it loads. One that keeps the conversation's prompts first (its load restores them), then
   the most free memory.
4. Else a refusal that names the model and why no worker can take it.

A model without a known digest (its hash job has not run yet) cannot be found by content: any
worker may take it (its file path is the spec's, rule 3 then reads "by path"). With no worker
announced (they are starting, or the only one vanished), the request goes to the shared queue,
where the first worker up takes it: SplitClient's waiting rules apply there.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from inference.engine.refusals import RefusalKind, Refused
from inference.serving.announcement import LoadedModel, WorkerAnnouncement

CONVERSATION = "conversation"  # rule 1
KEPT = "kept prompt"  # rule 1, by a worker's announced kept conversations
LOADED = "loaded"  # rule 2
SECOND_COPY = "second copy"  # rule 2's exception
CAN_LOAD = "can load"  # rule 3
BY_PATH = "by path"  # rule 3 for a model whose digest is unknown
SHARED_QUEUE = "shared queue"  # nobody announced yet
REASONS = (CONVERSATION, KEPT, LOADED, SECOND_COPY, CAN_LOAD, BY_PATH, SHARED_QUEUE)


@dataclass(slots=True, frozen=True)
class Route:
    worker: str | None  # None: the shared queue, whoever takes it first
    queue: str
    reason: str  # one of REASONS


@dataclass(slots=True, frozen=True)
class Wanted:
    """The model a request needs: its catalog name and content digest ("" when unknown)."""

    name: str
    sha256: str = ""
    conversation: str = ""  # its conversation's digest (tiers.entries), "" for none
    mmproj_sha256: str = ""  # its vision projector's digest: a worker needs that file too


class NoRoute(Refused, LookupError):
    """No live worker can take the model."""


def route(
    workers: Iterable[WorkerAnnouncement],
    model: Wanted,
    *,
    shared_queue: str,
    affinity: str | None = None,
    avoid: frozenset[str] = frozenset(),
) -> Route:
    """The worker for a request of `model` (module doc). `affinity`: the worker that served the
    conversation; `avoid`: workers not to choose (one that vanished with the request queued)."""
    workers = sorted((w for w in workers if w.worker not in avoid), key=lambda w: w.worker)
    if not workers:
        return Route(None, shared_queue, SHARED_QUEUE)
    holders = [(w, m) for w in workers if (m := _loaded(w, model)) is not None]
    # 1.
    for worker, _ in holders:
        if worker.worker == affinity:
            return Route(worker.worker, worker.queue, CONVERSATION)
    keeping = [(w, m) for w, m in holders if model.conversation and model.conversation in w.warm]
    if keeping:
        worker, _ = min(keeping, key=lambda pair: _load(*pair))
        return Route(worker.worker, worker.queue, KEPT)
    # 2.
    if holders:
        worker, copy = min(holders, key=lambda pair: _load(*pair))
        if copy.slots_free or not copy.waiting:
            return Route(worker.worker, worker.queue, LOADED)
        spare = _can_load(workers, model, exclude={w.worker for w, _ in holders})
        if spare:
            return Route(spare[0].worker, spare[0].queue, SECOND_COPY)
        return Route(worker.worker, worker.queue, LOADED)
    # 3.
    able = _can_load(workers, model)
    if model.conversation:  # a worker that keeps its prompts first (sorted() is stable)
        able = sorted(able, key=lambda w: model.conversation not in w.warm)
    if able:
        return Route(able[0].worker, able[0].queue, CAN_LOAD if model.sha256 else BY_PATH)
    # 4.
    raise _refusal(workers, model)


def _loaded(worker: WorkerAnnouncement, model: Wanted) -> LoadedModel | None:
    for copy in worker.loaded:
        if model.sha256 and copy.sha256:
            if copy.sha256 == model.sha256:
                return copy
        elif copy.name == model.name:  # a digest unknown on one side: the name says it
            return copy
    return None


def _load(worker: WorkerAnnouncement, copy: LoadedModel) -> tuple:
    """Busier sorts later: the model's sequences per slot, then the worker's whole load."""
    per_slot = (copy.running + copy.waiting) / max(1, copy.slots_total)
    return per_slot, worker.running + worker.queue_depth, worker.worker


def _size(worker: WorkerAnnouncement, model: Wanted) -> int | None:
    """The model's file size on this worker (with its projector's); None: it has no copy of
    one of them. Unknown digest: 0."""
    if not model.sha256:
        return 0
    sizes = {s.sha256: s.size_bytes for s in worker.serves}
    if model.sha256 not in sizes or (model.mmproj_sha256 and model.mmproj_sha256 not in sizes):
        return None
    return sizes[model.sha256] + (sizes[model.mmproj_sha256] if model.mmproj_sha256 else 0)


def _free(worker: WorkerAnnouncement) -> int:
    return worker.vram_free_bytes if worker.vram_free_bytes is not None else worker.ram_free_bytes


def _can_load(
    workers: list[WorkerAnnouncement], model: Wanted, exclude: set[str] = frozenset()
) -> list[WorkerAnnouncement]:
    """Workers with the file and room for it, the most free memory first."""
    able = []
    for worker in workers:
        size = _size(worker, model)
        if worker.worker in exclude or size is None:
            continue
        if max(_free(worker), worker.ram_free_bytes) >= size:
            able.append(worker)
    return sorted(able, key=lambda w: (-max(_free(w), w.ram_free_bytes), w.worker))


def _refusal(workers: list[WorkerAnnouncement], model: Wanted) -> NoRoute:
    having = [w for w in workers if _size(w, model) is not None]
    names = ", ".join(w.worker for w in workers)
    if not having:
        return NoRoute(
            f"no inference worker has a copy of {model.name} (sha256 {model.sha256[:12]}…); "
            f"running: {names}",
            kind=RefusalKind.UNAVAILABLE,
        )
    size = _size(having[0], model) or 0
    room = "; ".join(f"{w.worker} has {_gb(max(_free(w), w.ram_free_bytes))} free"
                     for w in having)  # fmt: skip
    return NoRoute(
        f"{model.name} ({_gb(size)}) fits on no inference worker that has it: {room}",
        kind=RefusalKind.NO_MEMORY,
    )


def _gb(n: int) -> str:
    return f"{n / 1e9:.1f} GB"
