"""One embedding request from the web process to a runner and back, the same in both modes.

    result = await embed(host, job, spec)   # it may load the model first

The job travels as a plain dict in split mode (Celery JSON), like a GenerationRequest; the result
comes back as an EmbedResult, whose vectors cross Redis as base64 of their float32 bytes. A
refusal or failure is an EmbedError carrying the same error event (with its `code`) that a
refused generation gives, so the API maps both to the same statuses.
"""

import asyncio
import base64
import uuid
from dataclasses import asdict, dataclass, field

from inference.engine.embedding import Embedding
from inference.engine.host import EngineHost, ModelSpec
from inference.engine.refusals import RefusalKind, Refused, error_event
from inference.serving.core import refusal_event

EMBED_TIMEOUT_S = 600.0  # MAX_INPUTS inputs of a large model on a slow CPU take minutes


@dataclass(slots=True)
class EmbedJob:
    model: str
    inputs: list[str | list[int]]
    truncate: bool = True
    keep_alive: float | None = None  # seconds; None: the model's own setting
    # With a query, `inputs` are documents a reranker scores against it (one float each).
    query: str | None = None
    truncate_left: bool = False  # with truncate: cut an over-long input's start, not its end
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(slots=True, frozen=True)
class EmbedResult:
    embedding: Embedding
    load_seconds: float = 0.0  # the model load this request waited for

    def to_dict(self) -> dict:
        e = self.embedding
        return {"dim": e.dim, "data": base64.b64encode(e.data).decode("ascii"),
                "token_counts": list(e.token_counts), "seconds": e.seconds,
                "load_seconds": self.load_seconds}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict) -> "EmbedResult":
        embedding = Embedding(int(data["dim"]), base64.b64decode(data["data"]),
                              tuple(int(n) for n in data["token_counts"]),
                              float(data["seconds"]))  # fmt: skip
        return cls(embedding, float(data["load_seconds"]))


class EmbedError(Exception):
    """An embedding request that was refused or failed; `event` is its error event."""

    def __init__(self, event: dict):
        super().__init__(event.get("message", ""))
        self.event = event

    @classmethod
    def of(cls, request_id: str, exc: BaseException) -> "EmbedError":
        if isinstance(exc, Refused) and exc.kind == RefusalKind.FAILED:  # EmbeddingFailed
            return cls(error_event(request_id, RefusalKind.FAILED,
                                   f"the embedding failed: {exc}"))  # fmt: skip
        if isinstance(exc, TimeoutError):
            what = f"no embedding within {EMBED_TIMEOUT_S:.0f} s"
            return cls(error_event(request_id, RefusalKind.UNAVAILABLE, what))
        return cls(refusal_event(request_id, exc))


async def embed(host: EngineHost, job: EmbedJob, spec: ModelSpec) -> EmbedResult:
    """Load the model if needed (in a thread), embed the job's inputs, restart the keep-alive
    clock. The wait for the vectors holds no thread: a few slow embeddings must not use up the
    executor that every chat's submit runs on. A caller that leaves does not cancel the
    computation (shielded): the engine settles its Future either way."""
    try:
        future, waited = await asyncio.to_thread(
            host.embed, spec, job.inputs, truncate=job.truncate, keep_alive=job.keep_alive,
            query=job.query, truncate_left=job.truncate_left,
        )
        computing = asyncio.shield(asyncio.wrap_future(future))
        embedding = await asyncio.wait_for(computing, EMBED_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - every refusal becomes an EmbedError
        raise EmbedError.of(job.request_id, exc) from None
    finally:
        host.touch(spec.name)
    return EmbedResult(embedding, waited)
