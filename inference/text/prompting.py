"""Turning a conversation into the prompt text a model expects, through its chat template.

Templates come from GGUF metadata (or the admin's override) and are rendered only in a sandbox,
inside a render process with memory, CPU and wall-clock limits (inference.gguf.render_pool).

One path for the chat page and every API dialect (`prompt_for`, `raw_prompt`), so the same
messages give the same tokens whichever way they arrive: the BOS token is added unless the
template wrote it (`add_special`), and the answer's thinking is split the same way.

The request's thinking switch (inference.text.thinking) is applied here too: the template gets
`enable_thinking` / `reasoning_effort`, and a template that opens a <think> block in the prompt
without a switch of its own (DeepSeek-R1) gets the block closed when thinking is off.

Images are parts of a message's content (a list of text and Images, in the order sent), and the
prompt carries them as llama-server does (common/chat.cpp, `to_json_oaicompat`): a message with
an image reaches the template as one string, its text parts joined by a newline, with no newline
before or after a media marker, and each image's marker where it was. The template sees text
only; the rendered prompt holds one MEDIA_MARKER per image and `Prompt.media` the images in the
markers' order (inference.engine.media), read from where the template put them. llama-server
renders its own marker text (random per process); the runner splits the prompt at the markers
and tokenizes the text between them alone, so the marker's text reaches no token either way.
"""

import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass

from inference.engine.media import MEDIA_MARKER, Image
from inference.engine.refusals import RefusalKind, Refused
from inference.gguf.chat_template import ChatTemplateError
from inference.gguf.render_pool import render_chat_isolated, render_executor
from inference.models import LLMModel
from inference.text.thinking import (
    Think,
    ThinkingSplitter,
    close_thinking,
    prompt_opens_thinking,
    template_variables,
    thinking_mode,
)

__all__ = [
    "Content",
    "Prompt",
    "join_parts",
    "prompt_for",
    "raw_prompt",
    "render_executor",
    "render_prompt",
]

# A message's content: text, or its parts in the order sent (text, and images where they go).
Part = str | Image
Content = str | Sequence[Part]


def join_parts(parts: Sequence[Part], marker=lambda image: MEDIA_MARKER) -> str:
    """A content's parts as one text, as llama-server joins them: text parts by a newline, no
    newline before or after an image's marker (`marker(image)`: its text)."""
    text, after_marker = "", False
    for part in parts:
        if isinstance(part, Image):
            text += marker(part)
            after_marker = True
            continue
        if text and not after_marker:
            text += "\n"
        text += part
        after_marker = False
    return text


def images_of(content: Content) -> list[Image]:
    return [] if isinstance(content, str) else [p for p in content if isinstance(p, Image)]


class _Slots:
    """Stand-ins for the images of one conversation while its template runs: each image's own
    marker text (a nonce no message can guess, as llama-server's marker is random), so the
    images are read back in the order the template placed them, whatever it does with
    messages. The text a client sent may not hold MEDIA_MARKER itself beside images: the
    runner would read it as one more image."""

    def __init__(self):
        self.images: list[Image] = []
        self.nonce = secrets.token_hex(8)
        self.pattern = re.compile(rf"<__media_{self.nonce}_(\d+)__>")

    def message(self, message: dict) -> dict:
        """The message with its parts joined, each image's stand-in where it goes."""
        content = message.get("content")
        if content is None or isinstance(content, str):
            return message
        return {**message, "content": join_parts(content, self._stand_in)}

    def _stand_in(self, image: Image) -> str:
        self.images.append(image)
        return f"<__media_{self.nonce}_{len(self.images) - 1}__>"

    def place(self, rendered: str) -> tuple[str, tuple[Image, ...]]:
        """The rendered text with MEDIA_MARKERs, and its images in their order."""
        if not self.images:
            return rendered, ()
        if MEDIA_MARKER in rendered:
            raise Refused(f"the text holds {MEDIA_MARKER}, which marks where an image goes: "
                          "remove it from a request with images", kind=RefusalKind.INVALID,
                          field="messages")  # fmt: skip
        placed = [int(index) for index in self.pattern.findall(rendered)]
        if sorted(placed) != list(range(len(self.images))):
            raise ChatTemplateError("the template does not show every image once")
        return self.pattern.sub(MEDIA_MARKER, rendered), tuple(self.images[i] for i in placed)


@dataclass(slots=True, frozen=True)
class Prompt:
    """A rendered prompt and how to read the answer to it."""

    text: str
    add_special: bool  # False when the text already starts with the model's BOS token
    thinking: bool = False  # the answer may open with a <think> block: split it off
    opens_thinking: bool = False  # the prompt ends inside that block: the answer starts in it
    media: tuple[Image, ...] = ()  # its images, in the order of the MEDIA_MARKERs in the text
    # Or its token ids, laid out already (a fill-in-the-middle prompt, inference.text.infill):
    # sent as they are, `text` and `add_special` unused.
    tokens: tuple[int, ...] | None = None

    def splitter(self) -> ThinkingSplitter | None:
        return ThinkingSplitter(inside=self.opens_thinking) if self.thinking else None

    def then(self, written: str) -> "Prompt":
        """This prompt with `written` appended (a Continue writes on from a partial answer,
        past any thinking)."""
        return Prompt(self.text + written, self.add_special, media=self.media)


def add_special(model: LLMModel, text: str) -> bool:
    """Whether the tokenizer must add the BOS token: not when the text starts with it (a
    template that writes its own would otherwise get a second one)."""
    bos = (model.metadata or {}).get("bos_token") or ""
    return not (bos and text.startswith(bos))


def prompt_for(
    model: LLMModel, messages: list[dict], *, tools: list | None = None, think: Think = None
) -> Prompt:
    """The prompt of a conversation (see render_prompt), for the chat page and the API alike.
    A message's content may be parts with images (the module's docstring): Refused (invalid)
    for text that holds MEDIA_MARKER beside them, ChatTemplateError for a template that drops
    or repeats an image."""
    slots = _Slots()
    messages = [slots.message(m) for m in messages]
    text, media = slots.place(render_prompt(model, messages, tools=tools, think=think))
    thinks = bool(thinking_mode(model.effective_chat_template))
    return Prompt(text, add_special(model, text), thinks, thinks and prompt_opens_thinking(text),
                  media)  # fmt: skip


def raw_prompt(model: LLMModel, content: Content, think: Think = None) -> Prompt:
    """A prompt sent as is (Ollama's raw: true), or its parts with images: its answer is split
    only when asked to think, starting inside the block when the prompt opened one."""
    text = content if isinstance(content, str) else join_parts(content)
    media = tuple(images_of(content))
    if media and text.count(MEDIA_MARKER) != len(media):
        raise Refused(f"the prompt holds {MEDIA_MARKER}, which marks where an image goes: "
                      "remove it from a request with images", kind=RefusalKind.INVALID,
                      field="prompt")  # fmt: skip
    thinks = think not in (None, False)
    return Prompt(text, add_special(model, text), thinks, thinks and prompt_opens_thinking(text),
                  media)  # fmt: skip


def with_model_messages(model: LLMModel, messages: list[dict]) -> list[dict]:
    """The conversation as the model gets it: its default system prompt first when the
    conversation has none, then its seed messages (a derived model's MESSAGE lines), then the
    conversation's own after any system message it opens with."""
    if model.system_prompt and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": model.system_prompt}, *messages]
    seed = [m for m in model.seed_messages or () if isinstance(m, dict)]
    if not seed:
        return messages
    lead = 0
    while lead < len(messages) and messages[lead].get("role") == "system":
        lead += 1
    return [*messages[:lead], *seed, *messages[lead:]]


def render_prompt(
    model: LLMModel, messages: list[dict], *, tools: list | None = None, think: Think = None
) -> str:
    """The model's chat template applied to `messages`, with the model's default system prompt
    and seed messages placed first (with_model_messages). `think`: None leaves thinking to the
    template, False turns it off, True or a level ("low", "medium", "high") turns it on.

    Blocks up to ~5 s; from async code, run it in render_executor(), not the default pool."""
    messages = with_model_messages(model, messages)
    template = model.effective_chat_template or None
    prompt = render_chat_isolated(
        template,
        messages,
        bos_token=model.metadata.get("bos_token", ""),
        eos_token=model.metadata.get("eos_token", ""),
        add_generation_prompt=True,
        tools=tools,
        **template_variables(template, think),
    )
    if think is False and prompt_opens_thinking(prompt):
        prompt = close_thinking(prompt)
    return prompt
