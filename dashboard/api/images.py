"""Images in request bodies, read once, at the edge, for every dialect.

Each dialect's image (OpenAI chat's `image_url` part, Responses' `input_image`, Anthropic's
`image` block, Ollama's `images`) becomes an inference.engine.media.Image among its message's
content parts, where it was sent (inference.text.prompting renders them as llama-server does).
Nothing here decodes pixels: the bytes are checked to be a picture the runner's decoder reads
(their kind sniffed from the magic bytes), and libmtmd decodes them in the runner.

- A `data:` URL (`data:image/jpeg;base64,...`) or bare base64, as llama-server takes them.
- An `http(s)` URL is a 400: the appliance fetches nothing for a request (llama-server answers
  500); `file:` and any other scheme too.
- Ollama's `images` go where Ollama puts them (`ollama_parts`).

Every error is a ValueError, raised while the body is validated, so its 400 names the field
(dashboard.api.bodies.validation_error). How many images a request may carry, and which models
take them, the answer pipeline checks once for every dialect (dashboard.api.pipeline.render).
"""

import re
from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import BeforeValidator, InstanceOf, WithJsonSchema

from inference.engine.media import Image
from inference.engine.refusals import Refused
from inference.text.prompting import Content

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")  # base64 has no ":"
FETCHED = ("http://", "https://")


def image_from_base64(text: Any) -> Image:
    """An image from its base64 text; a ValueError says what is wrong with it."""
    if not isinstance(text, str):
        raise ValueError("an image must be base64 text")
    try:
        return Image.from_base64(text)
    except Refused as exc:
        raise ValueError(exc.message) from None


def image_from_url(url: Any) -> Image:
    """An image from an image URL as OpenAI's clients send it: a base64 `data:` URL (or bare
    base64, which llama-server also takes); a URL to fetch is refused."""
    if not isinstance(url, str) or not url:
        raise ValueError("an image URL must be a non-empty string")
    if url.lower().startswith(FETCHED):
        raise ValueError("image URLs are not fetched: send the picture itself as a base64 data: "
                         "URL (data:image/jpeg;base64,...)")  # fmt: skip
    if not url.startswith("data:"):
        if _SCHEME.match(url):
            scheme = url.split(":", 1)[0]
            raise ValueError(f"{scheme}: image URLs are not supported: send a base64 data: URL "
                             "(data:image/jpeg;base64,...)")  # fmt: skip
        return image_from_base64(url)
    header, comma, payload = url.partition(",")
    if not comma or not header.endswith(";base64"):
        raise ValueError("a data: URL must be base64: data:image/jpeg;base64,...")
    mime = header[len("data:") :].split(";", 1)[0].lower()
    if not mime.startswith("image/"):
        raise ValueError(f"a data: URL of type {mime or '(none)'!r} is not an image")
    return image_from_base64(payload)


# Content parts after validation: text, and images where they go (inference.text.prompting).
Parts = list[str | InstanceOf[Image]]
# An image sent as base64 text (Ollama's `images`), an Image once validated.
Base64Image = Annotated[
    InstanceOf[Image],
    BeforeValidator(image_from_base64),
    WithJsonSchema({"type": "string", "contentEncoding": "base64"}),
]


def ollama_parts(content: str, images: Sequence[Image]) -> Content:
    """A message's text and its `images` as Ollama places them (server/prompt.go, chatPrompt),
    which is what Ollama's clients write their prompts for: each image takes the next `[img]`
    placeholder in the text (Frigate writes one per image), and the images left over go before
    the text, in order, with nothing between (Ollama's "[img-N]" tags, in front of the text).
    llama-server has no `images` field to compare with: its own content parts are placed where
    they are sent (prompting.join_parts)."""
    if not images:
        return content
    pieces = content.split("[img]")
    placed = min(len(images), len(pieces) - 1)
    parts: list[str | Image] = list(images[placed:])
    for index, piece in enumerate(pieces):
        if piece:
            parts.append(piece)
        if index < placed:
            parts.append(images[index])
        elif index < len(pieces) - 1:
            parts.append("[img]")  # more placeholders than images: the rest stay text
    return _merge_text(parts)


_TAG = re.compile(r"\[img-(\d+)\]")


def ollama_raw_parts(prompt: str, images: Sequence[Image]) -> Content:
    """A raw prompt's images (Ollama's generate with raw: true). Ollama's runner reads only its
    own tags in a raw prompt, `[img-N]` for the N-th image, and drops an image no tag names;
    here the tags place the images the same way, and an image no tag names is a 400 rather
    than lost. A raw prompt without tags places its images as a message does (ollama_parts)."""
    if not images or not _TAG.search(prompt):
        return ollama_parts(prompt, images)
    parts: list[str | Image] = []
    named, at = set(), 0
    for tag in _TAG.finditer(prompt):
        index = int(tag.group(1))
        if index >= len(images):
            raise ValueError(f"the prompt's [img-{index}] names no image: {len(images)} sent")
        parts += [prompt[at : tag.start()], images[index]]
        named.add(index)
        at = tag.end()
    parts.append(prompt[at:])
    if len(named) < len(images):
        left = ", ".join(str(i) for i in range(len(images)) if i not in named)
        raise ValueError(f"the prompt names its images with [img-N] tags but not image {left}")
    return _merge_text([part for part in parts if part != ""])


def _merge_text(parts: list[str | Image]) -> list[str | Image]:
    """Adjacent text pieces as one (join_parts would put a newline between them)."""
    merged: list[str | Image] = []
    for part in parts:
        if isinstance(part, str) and merged and isinstance(merged[-1], str):
            merged[-1] += part
        else:
            merged.append(part)
    return merged


def text_chars(content: Content | None) -> int:
    """The characters of a content's text (its images are bounded by the body's size)."""
    if content is None:
        return 0
    if isinstance(content, str):
        return len(content)
    return sum(len(part) for part in content if isinstance(part, str))
