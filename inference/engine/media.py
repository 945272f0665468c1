"""An image in a request: what a dialect parses once, at the edge, and the runner reads.

A request with media carries its prompt as text with one `MEDIA_MARKER` where each image goes,
in order, and the images beside it (`GenerationRequest.media`), as llama-server renders content
parts: the text and its media marker, in order. Nothing between the web side and the runner
looks inside the bytes: the kind is sniffed from the magic bytes so a file that is no picture
at all is a 400 at the edge, but the pixels are decoded by the runner's own decoder process
(libmtmd's decoder: inference.engine.picture_decoder), never in the web process nor in the runner
itself, so a decoder crash costs that answer only.

An image's identity is the sha256 of its bytes: the runner's encoder cache and the prompt cache
key an image span by it (with the projector's digest), so the same picture sent again, in any
dialect, is recognised.
"""

import base64
import binascii
import hashlib
from dataclasses import dataclass

from inference.engine.refusals import RefusalKind, Refused

# libmtmd's default marker (mtmd_default_marker()): where an image goes in the prompt text.
MEDIA_MARKER = "<__media__>"

# The picture formats the runner's decoder (stb_image in libmtmd) reads, by their magic bytes.
# WebP is not among them in the pinned llama.cpp: it gets a clear 400 rather than a 500.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\xff\xd8\xff", "jpeg"),
    (b"\x89PNG\r\n\x1a\n", "png"),
    (b"GIF87a", "gif"),
    (b"GIF89a", "gif"),
    (b"BM", "bmp"),
)
KINDS = ("jpeg", "png", "gif", "bmp")
MIME_TYPES = {f"image/{kind}": kind for kind in KINDS} | {"image/jpg": "jpeg"}


def sniff(data: bytes) -> str | None:
    """The picture format of `data` by its magic bytes, or None."""
    for magic, kind in _MAGIC:
        if data.startswith(magic):
            return kind
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp"
    return None


@dataclass(slots=True, frozen=True)
class Image:
    """One image of a request: its bytes as sent, their kind and their sha256 (hex)."""

    data: bytes
    kind: str
    digest: str

    @classmethod
    def from_bytes(cls, data: bytes, *, field: str = "images") -> "Image":
        """An image from the bytes a client sent; anything that is not a picture the runner
        can decode is refused as invalid, naming `field`."""
        if not data:
            raise Refused("an image is empty", kind=RefusalKind.INVALID, field=field)
        kind = sniff(data)
        if kind is None:
            raise Refused("an image is not a JPEG, PNG, GIF or BMP picture",
                          kind=RefusalKind.INVALID, field=field)  # fmt: skip
        if kind not in KINDS:
            raise Refused(f"{kind.upper()} images are not supported: send JPEG, PNG, GIF or BMP",
                          kind=RefusalKind.INVALID, field=field)  # fmt: skip
        return cls(data, kind, hashlib.sha256(data).hexdigest())

    @classmethod
    def from_base64(cls, text: str, *, field: str = "images") -> "Image":
        """An image from its base64 text (Ollama's `images`, a data: URL's payload)."""
        try:
            data = base64.b64decode(text.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise Refused("an image is not valid base64", kind=RefusalKind.INVALID,
                          field=field) from None  # fmt: skip
        return cls.from_bytes(data, field=field)

    def __post_init__(self) -> None:
        if not isinstance(self.data, bytes) or self.kind not in KINDS:
            raise Refused("malformed image", kind=RefusalKind.INVALID, field="media")
        if len(self.digest) != 64:
            raise Refused("malformed image digest", kind=RefusalKind.INVALID, field="media")

    def __repr__(self) -> str:  # bytes in a log line would be megabytes
        return f"Image({self.kind}, {len(self.data)} bytes, {self.digest[:12]})"

    # --- as JSON (split mode) ------------------------------------------------------------------

    def to_wire(self) -> dict:
        return {"data": base64.b64encode(self.data).decode("ascii"), "kind": self.kind,
                "digest": self.digest}  # fmt: skip

    @classmethod
    def from_wire(cls, data: object) -> "Image":
        if not isinstance(data, dict) or not isinstance(data.get("data"), str):
            raise Refused("malformed image", kind=RefusalKind.INVALID, field="media")
        image = cls.from_base64(data["data"], field="media")
        if data.get("digest") not in (None, image.digest):
            raise Refused("an image's digest does not match its bytes",
                          kind=RefusalKind.INVALID, field="media")  # fmt: skip
        return image
