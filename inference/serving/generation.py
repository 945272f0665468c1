"""The message a web process sends to whoever runs the engine: what to generate, where, how.

It travels as a plain dict (Celery JSON in split mode), so it carries the model's spec too: an
inference worker on another box needs no database, only the model file.
"""

import time
import uuid
from dataclasses import asdict, dataclass, field

from inference.engine.host import ModelSpec


@dataclass(slots=True)
class Generation:
    model: str
    prompt: str
    params: dict = field(default_factory=dict)  # SamplingParams fields
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    cache_key: str | None = None  # conversation id, for the prefix cache
    cache_partition: str | None = None  # whose cached KV it may reuse: "apikey:<id>", "user:<id>"
    keep_alive: float | None = None  # seconds; None: the model's own setting
    add_special: bool = True
    accepted_wall: float = field(default_factory=time.time)  # wall clock: crosses processes

    def accepted_perf(self) -> float:
        """The acceptance time on this process's perf_counter clock (for queue time and TTFT)."""
        return time.perf_counter() - max(0.0, time.time() - self.accepted_wall)

    def to_dict(self) -> dict:
        return asdict(self)


def spec_to_dict(spec: ModelSpec) -> dict:
    return {"name": spec.name, "keep_alive": spec.keep_alive, "config": asdict(spec.config),
            "min_ctx": spec.min_ctx}  # fmt: skip


def spec_from_dict(data: dict) -> ModelSpec:
    from inference.engine.runner_config import RunnerConfig

    return ModelSpec(data["name"], RunnerConfig(**data["config"]), data["keep_alive"],
                     min_ctx=int(data.get("min_ctx") or 0))  # fmt: skip
