"""What an inference worker tells the web side about itself, every heartbeat (split mode): the
models it can serve (by sha256: each box finds its own files), the models it has loaded and
their free slots, its load and its free memory, and the conversations whose prompts it keeps
(in a slot or a tier: inference.engine.tiers; digests, not the keys, at most MAX_WARM). The
router (inference.serving.routing) chooses a worker from these; the dashboard's boxes panel
shows them.

Stored as JSON under split_protocol.announce_key(worker) with the heartbeat's TTL, so a worker
that dies disappears from the announcements within seconds. `from_json` checks every field: a
garbled or foreign value raises ValueError and is skipped by the reader, never routed to.
"""

import json
from dataclasses import asdict, dataclass
from typing import Any

SHA256_CHARS = 64
MAX_NAME_CHARS = 200
MAX_WARM = 1024  # conversations one announcement names
DIGEST_CHARS = 16  # inference.engine.tiers.entries.conversation_digest


@dataclass(slots=True, frozen=True)
class ServedModel:
    """A model file this worker has: its content digest and size."""

    sha256: str
    size_bytes: int


@dataclass(slots=True, frozen=True)
class LoadedModel:
    """A model loaded on this worker (its catalog name), its context and sequence slots."""

    name: str
    sha256: str  # "" when the worker does not know the file's digest yet
    n_ctx: int  # tokens per sequence
    slots_total: int
    slots_free: int
    running: int  # sequences prefilling or decoding
    waiting: int  # requests queued in its engine


@dataclass(slots=True, frozen=True)
class WorkerAnnouncement:
    worker: str  # the Celery node name, e.g. "inference@nas"
    instance: str  # a new id at every start: a restarted worker is a new one
    host: str
    queue: str  # its own queue, split_protocol.worker_queue(worker)
    serves: tuple[ServedModel, ...]
    loaded: tuple[LoadedModel, ...]
    queue_depth: int  # requests this worker has taken and not yet handed to an engine
    running: int  # requests this worker is answering
    ram_free_bytes: int
    vram_free_bytes: int | None  # None: no GPU
    time: float  # when it was taken (epoch seconds)
    warm: tuple[str, ...] = ()  # digests of the conversations whose prompts it keeps

    def serves_sha(self, sha256: str) -> bool:
        return any(model.sha256 == sha256 for model in self.serves)

    def loaded_sha(self, sha256: str) -> LoadedModel | None:
        return next((model for model in self.loaded if sha256 and model.sha256 == sha256), None)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> "WorkerAnnouncement":
        try:
            data = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"an announcement that is not JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ValueError("an announcement must be a JSON object")
        return cls(
            worker=_name(data, "worker"),
            instance=_name(data, "instance"),
            host=_name(data, "host"),
            queue=_name(data, "queue"),
            serves=tuple(_served(item) for item in _list(data, "serves")),
            loaded=tuple(_loaded(item) for item in _list(data, "loaded")),
            queue_depth=_count(data, "queue_depth"),
            running=_count(data, "running"),
            ram_free_bytes=_count(data, "ram_free_bytes"),
            vram_free_bytes=None if data.get("vram_free_bytes") is None
            else _count(data, "vram_free_bytes"),
            time=_number(data, "time"),
            warm=_digests(data.get("warm", [])),  # absent from a worker of an older version
        )  # fmt: skip


def _field(data: dict, key: str) -> Any:
    if key not in data:
        raise ValueError(f"an announcement without {key!r}")
    return data[key]


def _name(data: dict, key: str) -> str:
    value = _field(data, key)
    if not isinstance(value, str) or not value or len(value) > MAX_NAME_CHARS:
        raise ValueError(f"{key} must be a non-empty string of at most {MAX_NAME_CHARS} chars")
    return value


def _count(data: dict, key: str) -> int:
    value = _field(data, key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{key} must be a non-negative integer, got {value!r}")
    return value


def _number(data: dict, key: str) -> float:
    value = _field(data, key)
    if not isinstance(value, int | float) or isinstance(value, bool) or value != value:
        raise ValueError(f"{key} must be a number, got {value!r}")
    return float(value)


def _list(data: dict, key: str) -> list:
    value = _field(data, key)
    if not isinstance(value, list):
        raise ValueError(f"{key} must be a list")
    return value


def _sha(data: dict, key: str, *, empty: bool = False) -> str:
    value = _field(data, key)
    if value == "" and empty:
        return value
    if not isinstance(value, str) or len(value) != SHA256_CHARS or value.strip("0123456789abcdef"):
        raise ValueError(f"{key} must be a lowercase hex sha256, got {value!r}")
    return value


def _digests(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_WARM:
        raise ValueError(f"warm must be a list of at most {MAX_WARM} digests")
    for item in value:
        if not isinstance(item, str) or len(item) != DIGEST_CHARS or item.strip("0123456789abcdef"):
            raise ValueError(f"warm holds {item!r}, not a conversation digest")
    return tuple(value)


def _served(item: object) -> ServedModel:
    if not isinstance(item, dict):
        raise ValueError("each served model must be an object")
    return ServedModel(sha256=_sha(item, "sha256"), size_bytes=_count(item, "size_bytes"))


def _loaded(item: object) -> LoadedModel:
    if not isinstance(item, dict):
        raise ValueError("each loaded model must be an object")
    return LoadedModel(
        name=_name(item, "name"), sha256=_sha(item, "sha256", empty=True),
        n_ctx=_count(item, "n_ctx"), slots_total=_count(item, "slots_total"),
        slots_free=_count(item, "slots_free"), running=_count(item, "running"),
        waiting=_count(item, "waiting"),
    )  # fmt: skip
