"""What a supervisor and its runner process say to each other, over one local connection.

Every payload is a dataclass (pickled by multiprocessing.connection); engine events cross as
the engine's own event dataclasses. One exchange at a time per direction is never assumed:
the runner answers each Submit with Accepted or Refused carrying the request id, and events of
many requests interleave on the same connection.

    supervisor → runner: Launch (first), then Submit, Cancel, Embed, SnapshotRequest, Shutdown
    runner → supervisor: Ready or LoadFailed (first), then Accepted, Refused, engine events,
                         Embedded or EmbedFailed (the answer to an Embed),
                         Snapshot (the answer to a SnapshotRequest), Stopped (after Shutdown)
"""

from dataclasses import dataclass, field
from typing import Literal

from inference.engine.embedding import Embedding
from inference.engine.params import SamplingParams

# A refusal's kind: how the supervisor raises it again on its side.
RefusalKind = Literal["invalid", "too_long", "busy", "stopped", "error"]


@dataclass(slots=True, frozen=True)
class Launch:
    """The runner's whole job description, sent first."""

    name: str
    config: object  # a RunnerConfig
    runner_factory: str  # "module:callable" that takes the config and returns a runner
    itl_target: float
    max_queue: int
    log_level: str = "INFO"


@dataclass(slots=True, frozen=True)
class Ready:
    info: dict  # the runner's facts (LlamaRunner.info())
    load_seconds: float
    pid: int


@dataclass(slots=True, frozen=True)
class LoadFailed:
    message: str


@dataclass(slots=True, frozen=True)
class Submit:
    request_id: str
    prompt: str | list[int]
    params: SamplingParams
    accepted_at: float  # time.perf_counter(): CLOCK_MONOTONIC, the same in every process here
    load_time: float = 0.0
    cache_key: str | None = None
    add_special: bool = True
    cache_partition: str | None = None


@dataclass(slots=True, frozen=True)
class Accepted:
    request_id: str


@dataclass(slots=True, frozen=True)
class Refused:
    request_id: str
    kind: RefusalKind
    message: str
    field: str | None = None  # the sampling field, for kind "invalid"


@dataclass(slots=True, frozen=True)
class Cancel:
    request_id: str


@dataclass(slots=True, frozen=True)
class Embed:
    """Embed these texts or token arrays (inference.engine.embedding); answered by Embedded or
    EmbedFailed with the same request id, once the vectors are computed."""

    request_id: str
    inputs: list[str | list[int]]
    truncate: bool = True


@dataclass(slots=True, frozen=True)
class Embedded:
    request_id: str
    embedding: Embedding


@dataclass(slots=True, frozen=True)
class EmbedFailed:
    request_id: str
    kind: RefusalKind
    message: str
    field: str | None = None  # the request field at fault, for kind "invalid"


@dataclass(slots=True, frozen=True)
class SnapshotRequest:
    serial: int


@dataclass(slots=True, frozen=True)
class Snapshot:
    serial: int
    snapshot: dict = field(default_factory=dict)  # Engine.snapshot()


@dataclass(slots=True, frozen=True)
class Shutdown:
    timeout: float = 10.0


@dataclass(slots=True, frozen=True)
class Stopped:
    pass
