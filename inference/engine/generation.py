"""The request to generate: built once, on the web side, and passed unchanged to the engine.

    request = GenerationRequest(prompt, SamplingParams(...), cache_key=..., model="smollm2")
    client.stream(request, spec)  →  serving core  →  host  →  runner channel  →  Engine.submit

Every hop hands the same frozen object on (vLLM's EngineCoreRequest): a new field is a change
to this class and to the code that reads it, nothing between. It crosses a process boundary
pickled (the runner channel) or as JSON (`to_wire` / `from_wire`, Celery in split mode), so it
carries the wall clock of its arrival, the one clock every process and box shares.
"""

import time
import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import Literal

from inference.engine.media import MEDIA_MARKER, Image
from inference.engine.params import SamplingParams
from inference.engine.refusals import RefusalKind, Refused

MAX_ID_CHARS = 128  # ids and keys come from the web side; a bound keeps them from growing logs
# Images in one request: Frigate sends up to 20 preview frames; more is refused, not truncated.
MAX_IMAGES = 32

# Who reads the answer: a person (interactive) or an app working through a batch (background).
Priority = Literal["interactive", "background"]
PRIORITIES: tuple[Priority, ...] = ("interactive", "background")


def new_request_id() -> str:
    return uuid.uuid4().hex


@dataclass(slots=True, frozen=True)
class GenerationRequest:
    prompt: str | tuple[int, ...]  # text (tokenized by the runner) or token ids
    params: SamplingParams = field(default_factory=SamplingParams)
    request_id: str = field(default_factory=new_request_id)
    model: str = ""  # the model's name in the catalog, for logs and routing
    add_special: bool = True  # False when the prompt already starts with the BOS token
    cache_key: str | None = None  # its conversation: its KV is kept for the next turn
    # Whose KV it may reuse and learn about: "apikey:<id>", "user:<id>", a household.
    cache_partition: str | None = None
    keep_alive: float | None = None  # seconds the model stays loaded after it; None: the model's
    arrived_wall: float = field(default_factory=time.time)  # when the request reached the app
    priority: Priority = "interactive"
    # Whose turn it takes in fair-share admission (inference.engine.admission): an app
    # ("apikey:<id>", or one of its users when the app names them), a person ("user:<id>").
    # None: the anonymous share, one for every request that names none.
    share: str | None = None
    # Its images, in the order of the MEDIA_MARKERs in its prompt text (inference.engine.media).
    media: tuple[Image, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.prompt, str):
            object.__setattr__(self, "prompt", tuple(self.prompt))
        object.__setattr__(self, "media", tuple(self.media))
        if self.media:
            self._check_media()
        if not isinstance(self.params, SamplingParams):
            raise TypeError("params must be SamplingParams")
        if self.priority not in PRIORITIES:
            raise Refused(f"priority must be one of {', '.join(PRIORITIES)}",
                          kind=RefusalKind.INVALID, field="priority")  # fmt: skip
        for name in ("request_id", "cache_key", "cache_partition", "share"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or len(value) > MAX_ID_CHARS):
                raise Refused(f"{name} must be a string of at most {MAX_ID_CHARS} characters",
                              kind=RefusalKind.INVALID, field=name)  # fmt: skip

    def _check_media(self) -> None:
        if len(self.media) > MAX_IMAGES:
            raise Refused(f"at most {MAX_IMAGES} images in one request",
                          kind=RefusalKind.INVALID, field="images")  # fmt: skip
        if not all(isinstance(image, Image) for image in self.media):
            raise TypeError("media must be Images")
        if not isinstance(self.prompt, str) or self.prompt.count(MEDIA_MARKER) != len(self.media):
            raise Refused("a prompt with images holds one media marker per image",
                          kind=RefusalKind.INVALID, field="images")  # fmt: skip

    def accepted_perf(self) -> float:
        """The arrival on this process's perf_counter clock (what queue time and TTFT count
        from): the wall-clock age carried over, so it holds in any process, on any box."""
        return time.perf_counter() - max(0.0, time.time() - self.arrived_wall)

    # --- as JSON (split mode) ----------------------------------------------------------------

    def to_wire(self) -> dict:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["params"] = asdict(self.params)
        if not isinstance(self.prompt, str):
            data["prompt"] = list(self.prompt)
        data["media"] = [image.to_wire() for image in self.media]
        return data

    @classmethod
    def from_wire(cls, data: object) -> "GenerationRequest":
        """The request from its JSON form; a malformed one is refused as invalid."""
        try:
            known = {f.name for f in fields(cls)}
            if not isinstance(data, dict) or not isinstance(data.get("params"), dict):
                raise TypeError("a request is an object with params")
            unknown = set(data) - known
            if unknown:
                raise TypeError(f"unknown request fields: {', '.join(sorted(unknown))}")
            media = data.get("media") or []
            if not isinstance(media, list):
                raise TypeError("media is a list")
            return cls(**{**data, "params": SamplingParams(**data["params"]),
                          "media": tuple(Image.from_wire(image) for image in media)})  # fmt: skip
        except Refused:
            raise
        except (TypeError, ValueError) as exc:
            raise Refused(f"malformed request: {exc}", kind=RefusalKind.INVALID) from None
