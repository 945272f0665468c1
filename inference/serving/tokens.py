"""One tokenize or detokenize request from the web process to a runner and back, the same in
both modes.

    result = await tokens(host, job, spec)   # it may load the model first (not if_loaded)

The job travels as a plain dict in split mode (Celery JSON, task "inference.tokenize"), as an
EmbedJob does, its images (a prompt with pictures to count, inference.engine.tokens rule 3) in
their wire form; the result comes back as a TokenResult, its pieces as base64 of their bytes. A
refusal or failure is a TokenError carrying the error event a refused generation gives (with its
`code`), so the API maps both to the same statuses.
"""

import asyncio
import base64
import uuid
from dataclasses import dataclass, field, fields
from typing import Literal

from inference.engine.host import EngineHost, ModelSpec
from inference.engine.media import Image
from inference.engine.refusals import RefusalKind, Refused, error_event
from inference.serving.core import refusal_event

TOKENS_TIMEOUT_S = 60.0  # a tokenize waits for a step boundary, never for a whole answer


@dataclass(slots=True)
class TokenJob:
    model: str
    op: Literal["tokenize", "detokenize"]
    text: str = ""  # tokenize this
    tokens: list[int] = field(default_factory=list)  # or detokenize these
    add_special: bool = True
    # False: special tokens' text ("<|endoftext|>") is plain characters, as llama-server reads
    # the code of /infill (dashboard.api.fim); every other caller parses it, as in a prompt.
    parse_special: bool = True
    with_pieces: bool = False
    # A tokenize on the model only if it is loaded (the chat page's counter): it never loads
    # one, nor restarts its keep-alive clock; a model not loaded is refused as unavailable.
    if_loaded: bool = False
    request_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    # The text's images, one per media marker (a tokenize only): read, never encoded. From a
    # dict (split mode) they come in their wire form, and a malformed one is a ValueError.
    images: tuple[Image, ...] = ()

    def __post_init__(self) -> None:
        try:
            self.images = tuple(image if isinstance(image, Image) else Image.from_wire(image)
                                for image in self.images)  # fmt: skip
        except Refused as exc:
            raise ValueError(exc.message) from None

    def to_dict(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self)}  # the images' bytes uncopied
        data["tokens"] = list(self.tokens)
        data["images"] = [image.to_wire() for image in self.images]
        return data


@dataclass(slots=True, frozen=True)
class TokenResult:
    tokens: tuple[int, ...] = ()
    pieces: tuple[bytes, ...] | None = None
    text: str = ""  # a detokenize's answer
    load_seconds: float = 0.0

    def to_dict(self) -> dict:
        pieces = None
        if self.pieces is not None:
            pieces = [base64.b64encode(piece).decode("ascii") for piece in self.pieces]
        return {"tokens": list(self.tokens), "pieces": pieces, "text": self.text,
                "load_seconds": self.load_seconds}  # fmt: skip

    @classmethod
    def from_dict(cls, data: dict) -> "TokenResult":
        pieces = data.get("pieces")
        return cls(tuple(int(t) for t in data["tokens"]),
                   None if pieces is None else tuple(base64.b64decode(p) for p in pieces),
                   str(data.get("text") or ""), float(data.get("load_seconds") or 0.0))  # fmt: skip


class TokenError(Exception):
    """A tokenize or detokenize that was refused or failed; `event` is its error event."""

    def __init__(self, event: dict):
        super().__init__(event.get("message", ""))
        self.event = event

    @classmethod
    def of(cls, request_id: str, exc: BaseException) -> "TokenError":
        if isinstance(exc, TimeoutError):
            what = f"no tokens within {TOKENS_TIMEOUT_S:.0f} s"
            return cls(error_event(request_id, RefusalKind.UNAVAILABLE, what))
        return cls(refusal_event(request_id, exc))


async def tokens(host: EngineHost, job: TokenJob, spec: ModelSpec) -> TokenResult:
    """Load the model if needed (in a thread), tokenize or detokenize in its runner, restart
    the keep-alive clock; `if_loaded` (tokenize only) does neither. The wait for the answer
    holds no thread."""
    try:
        if job.if_loaded:
            engine = host.get(spec.name)
            if engine is None or not engine.alive:
                raise Refused(f"{spec.name} is not loaded", kind=RefusalKind.UNAVAILABLE)
            future = engine.tokenize(job.text, add_special=job.add_special,
                                     parse_special=job.parse_special,
                                     with_pieces=job.with_pieces, images=job.images)  # fmt: skip
            waited = 0.0
        elif job.op == "detokenize":
            future, waited = await asyncio.to_thread(host.detokenize, spec, list(job.tokens))
        else:
            future, waited = await asyncio.to_thread(
                host.tokenize, spec, job.text, add_special=job.add_special,
                parse_special=job.parse_special, with_pieces=job.with_pieces, images=job.images,
            )  # fmt: skip
        answer = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)),
                                        TOKENS_TIMEOUT_S)  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - every refusal becomes a TokenError
        raise TokenError.of(job.request_id, exc) from None
    finally:
        if not job.if_loaded:
            host.touch(spec.name)
    if job.op == "detokenize":
        return TokenResult(text=answer, load_seconds=waited)
    return TokenResult(answer.ids, answer.pieces, load_seconds=waited)
