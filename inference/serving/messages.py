"""What a supervisor and its runner process say to each other, over one local connection.

Every payload is a dataclass (pickled by multiprocessing.connection); a request crosses as the
GenerationRequest the web side built, engine events as the engine's own event dataclasses, and
a refusal as its Refusal (kind, message, field). One exchange at a time per direction is never
assumed: the runner answers each Submit with Accepted or SubmitRefused carrying the request id, and
events of many requests interleave on the same connection.

    supervisor → runner: Launch (first), then Submit, Cancel, SetPriority, Embed, Tokenize,
                         Detokenize, ForgetPrompts, SnapshotRequest, Shutdown
    runner → supervisor: Ready or LoadFailed (first), then Accepted, SubmitRefused, engine events,
                         Embedded or EmbedFailed (the answer to an Embed),
                         Tokenized, Detokenized or TokensFailed (the answer to a Tokenize or
                         Detokenize),
                         PromptsForgotten (the answer to a ForgetPrompts),
                         Snapshot (the answer to a SnapshotRequest), Stopped (after Shutdown;
                         the runner then writes its RAM tier of kept prompts to disk and exits)
"""

from dataclasses import dataclass, field

from inference.engine.embedding import Embedding
from inference.engine.generation import GenerationRequest, Priority
from inference.engine.media import Image
from inference.engine.refusals import Refusal
from inference.engine.tiers.config import PromptCacheConfig


@dataclass(slots=True, frozen=True)
class Launch:
    """The runner's whole job description, sent first."""

    name: str
    config: object  # a RunnerConfig
    runner_factory: str  # "module:callable" that takes the config and returns a runner
    itl_target: float
    max_queue: int
    log_level: str = "INFO"
    background_itl_target: float = 1.0  # the loose step target of background streams
    prompt_cache: PromptCacheConfig | None = None  # warm memory (None: slots only)
    speculative: str = "auto"  # the box's SPECULATIVE_DECODING: off, auto or always


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
    request: GenerationRequest  # as the web side built it
    load_time: float = 0.0  # the model load its host charged to it


@dataclass(slots=True, frozen=True)
class Accepted:
    request_id: str


@dataclass(slots=True, frozen=True)
class SubmitRefused:
    request_id: str
    refusal: Refusal


@dataclass(slots=True, frozen=True)
class Cancel:
    request_id: str


@dataclass(slots=True, frozen=True)
class SetPriority:
    """Engine.set_priority: "interactive" or "background" from the next step on; an id the
    engine no longer has (or never had) is ignored."""

    request_id: str
    priority: Priority


@dataclass(slots=True, frozen=True)
class Embed:
    """Embed these texts or token arrays (inference.engine.embedding), or with a `query` score
    these documents against it (a reranker: inference.engine.reranking); answered by Embedded
    or EmbedFailed with the same request id, once the vectors are computed."""

    request_id: str
    inputs: list[str | list[int]]
    truncate: bool = True
    query: str | None = None
    truncate_left: bool = False


@dataclass(slots=True, frozen=True)
class Embedded:
    request_id: str
    embedding: Embedding


@dataclass(slots=True, frozen=True)
class EmbedFailed:
    request_id: str
    refusal: Refusal


@dataclass(slots=True, frozen=True)
class Tokenize:
    """The token ids of a text in the model's vocabulary (Engine.tokenize); answered by
    Tokenized or TokensFailed with the same request id."""

    request_id: str
    text: str
    add_special: bool = True
    with_pieces: bool = False  # also each id's bytes
    parse_special: bool = True  # false: special tokens' text is plain characters
    # The text's images, one per media marker: counted as a request reads them, not encoded.
    images: tuple[Image, ...] = ()


@dataclass(slots=True, frozen=True)
class Tokenized:
    request_id: str
    tokens: tuple[int, ...]
    pieces: tuple[bytes, ...] | None = None


@dataclass(slots=True, frozen=True)
class Detokenize:
    """The text of token ids (Engine.detokenize); answered by Detokenized or TokensFailed."""

    request_id: str
    tokens: tuple[int, ...]


@dataclass(slots=True, frozen=True)
class Detokenized:
    request_id: str
    text: str


@dataclass(slots=True, frozen=True)
class TokensFailed:
    request_id: str
    refusal: Refusal


@dataclass(slots=True, frozen=True)
class ForgetPrompts:
    """Drop the kept prompts of a partition (everything: of all) in every tier and idle slot
    (Engine.forget_prompts); answered by PromptsForgotten with the same request id."""

    request_id: str
    partition: str | None = None
    everything: bool = False


@dataclass(slots=True, frozen=True)
class PromptsForgotten:
    request_id: str
    entries: int  # tier entries dropped (-1: the engine had stopped)


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
