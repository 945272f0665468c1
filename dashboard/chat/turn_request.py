"""A chat turn's prompt and generation request: the system prompt, the turns that still fit
the context (dashboard.chat.window), the new question, rendered with the model's chat template
on the API's own path (inference.text.prompting); and the request built from it the API's way too
(inference.catalog.specs.request_for), with the chat page's answer length and prefix-cache key.

A question with pictures (dashboard.chat.images) reaches the template as OpenAI-style content
parts, the text first and then the images in the order they were attached, as Open WebUI and
the OpenAI clients send them (`as_chat_message`); the images become the request's media, one
media marker each in the prompt, in order (prompt_for, the API's own path). Only a model that
takes images (LLMModel.takes_images) is sent any.

Apart from dashboard.chat.turns, which persists the turn, because building the prompt only reads: a
refusal here (a chat template that fails) leaves nothing to undo.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from dashboard.chat import ChatRefused, images
from dashboard.chat import window as chat_window
from dashboard.models import ChatImage, Conversation, Message, person_partition
from inference.catalog.specs import request_for, spec_for
from inference.engine import GenerationRequest, InvalidParams
from inference.engine.generation import MAX_IMAGES
from inference.engine.media import Image
from inference.engine.params import MAX_TOKENS_LIMIT
from inference.engine.refusals import Refused
from inference.gguf.chat_template import ChatTemplateError
from inference.models import LLMModel
from inference.text.prompting import Prompt as Rendered
from inference.text.prompting import prompt_for

MIN_ANSWER_TOKENS = 2048  # the default answer length: what the context allows, at least this
# What a chat answer uses unless the model's own default_params say otherwise (max_tokens is
# filled in per model: the engine clamps it to the room the context leaves).
CHAT_DEFAULT_PARAMS = {"temperature": 0.7}
# What the window reckons an image costs in tokens (a projector's count varies: 64 for the
# tests' 112 px tower and per SmolVLM tile, 256 for Gemma 3, 576 for LLaVA-1.5, more for a large
# Qwen2.5-VL picture); a window still too long is refused by the engine with the exact numbers.
IMAGE_TOKENS_ESTIMATE = 256


def _said(branch: list[Message]) -> list[Message]:
    # An answer that failed before its first token says nothing.
    return [m for m in branch if m.role == Message.Role.USER or m.content]


def answer_tokens(message: Message) -> int:
    """An answer's length in tokens as measured (over all its Continues), 0 when unknown."""
    figures = message.figures or {}
    return int(figures.get("answer_tokens") or figures.get("output_tokens") or 0)


def _sized(message: Message, pictures: int) -> chat_window.Sized:
    tokens = answer_tokens(message) if message.role == "assistant" else None
    return chat_window.Sized(message.role, len(message.content), tokens or None,
                             pictures * IMAGE_TOKENS_ESTIMATE)  # fmt: skip


def question(message: Message) -> dict:
    """A saved question as `build`'s `new` takes it: its text and its images."""
    return {"role": message.role, "content": message.content, "images": list(message.images.all())}


@dataclass(slots=True)
class Prompt:
    rendered: Rendered  # the text, its BOS rule, its thinking split
    left_out: int
    context_start: int | None  # a message id; None when nothing was left out

    @property
    def text(self) -> str:
        return self.rendered.text

    @property
    def media(self) -> tuple[Image, ...]:
        """The images, in the order of the MEDIA_MARKERs in the text."""
        return self.rendered.media


def build(
    model: LLMModel,
    conversation: Conversation | None,
    system_prompt: str,
    earlier: list[Message],
    new: list[dict],
    *,
    partial: str = "",
) -> Prompt:
    """The rendered prompt: the system prompt, the most recent of `earlier` that fit, then
    `new` (the turn being asked: {"role", "content", "images"?: [ChatImage]}). With `partial`,
    the last message of `new` is the assistant's unfinished answer, which the model continues:
    it is appended after the generation prompt instead of being rendered as a finished turn.
    The images of `earlier`'s messages go with them, at most MAX_IMAGES in all: older turns
    are left out as for the context."""
    earlier = _said(earlier)
    pictures = _pictures(earlier)
    asked = sum(len(m.get("images") or ()) for m in new)
    sized = [_sized(m, len(pictures.get(m.pk, ()))) for m in earlier] + [
        chat_window.Sized(m["role"], len(m["content"]),
                          extra_tokens=len(m.get("images") or ()) * IMAGE_TOKENS_ESTIMATE)
        for m in new
    ]  # fmt: skip
    previous = 0
    if conversation is not None and conversation.context_start_id is not None:
        ids = [m.pk for m in earlier]
        if conversation.context_start_id in ids:
            previous = ids.index(conversation.context_start_id)
    window = chat_window.choose(sized, system_chars=len(system_prompt), n_ctx=context_of(model),
                                previous_start=previous)  # fmt: skip
    start = _within_image_cap(earlier, pictures, window.start, room=MAX_IMAGES - asked)
    kept = earlier[start:]
    shown = new[:-1] if partial else new
    if (asked or any(pictures.get(m.pk) for m in kept)) and not model.takes_images:
        raise ChatRefused("no_images", f"{model.name} does not take images: choose a model that "
                          "does, or remove the images")  # fmt: skip
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages += [as_chat_message(m.role, m.content, pictures.get(m.pk, ())) for m in kept]
    messages += [as_chat_message(m["role"], m["content"], m.get("images") or ()) for m in shown]
    try:
        rendered = prompt_for(model, messages)
    except ChatTemplateError as exc:
        raise ChatRefused("template", f"the model's chat template failed: {exc}") from None
    except Refused as exc:  # the text holds MEDIA_MARKER beside images
        raise ChatRefused("invalid", exc.message) from None
    left_out = min(start, len(earlier))
    first = earlier[start].pk if left_out and start < len(earlier) else None
    return Prompt(rendered.then(partial) if partial else rendered, left_out, first)


def _pictures(messages: list[Message]) -> dict[int, list[ChatImage]]:
    """The images of `messages`, by message id, in their order (one query)."""
    found: dict[int, list[ChatImage]] = {}
    questions = [m.pk for m in messages if m.role == Message.Role.USER]
    for image in ChatImage.objects.filter(message_id__in=questions).order_by("position", "id"):
        found.setdefault(image.message_id, []).append(image)
    return found


def _within_image_cap(
    earlier: list[Message], pictures: dict[int, list[ChatImage]], start: int, *, room: int
) -> int:
    """`start`, moved on past older turns until the kept ones hold at most `room` images (a
    window starts at a question, as chat_window's does)."""
    held = sum(len(pictures.get(m.pk, ())) for m in earlier[start:])
    while held > room and start < len(earlier):
        held -= len(pictures.get(earlier[start].pk, ()))
        start += 1
        while start < len(earlier) and earlier[start].role != Message.Role.USER:
            start += 1
    return start


def as_chat_message(role: str, text: str, stored: Sequence[ChatImage]) -> dict:
    """A message as the chat template reads it. With images: content parts (inference.text.
    prompting's), the text first (none when empty), then each image as the request's Image, in
    the order they were attached. The one place where stored pictures become parts of a
    prompt."""
    if not stored:
        return {"role": role, "content": text}
    parts: list[str | Image] = [text] if text else []
    parts += [images.load(image) for image in stored]
    return {"role": role, "content": parts}


def context_of(model: LLMModel) -> int:
    """Tokens per sequence the model gets: its setting, or for "automatic" (0) what the
    preflight would size it to now (its training context as far as memory allows)."""
    if model.n_ctx:
        return model.n_ctx
    try:
        from inference.planning.preflight import (
            automatic_ctx,
            gguf_info,
        )  # reads the GGUF header only

        return automatic_ctx(gguf_info(model.weights.file_path), spec_for(model).config)
    except Exception:  # noqa: BLE001 - a missing or unreadable file: the load will say why
        return model.context_length or 2048


def answer_defaults(model: LLMModel) -> dict:
    """The chat page's own sampling, under the model's defaults: an answer as long as the
    context allows (the engine clamps it to the room left)."""
    room = max(MIN_ANSWER_TOKENS, context_of(model))
    return {**CHAT_DEFAULT_PARAMS, "max_tokens": min(room, MAX_TOKENS_LIMIT)}


def answer_request(
    model: LLMModel, prompt: Prompt, conversation: Conversation, arrived: float
) -> GenerationRequest:
    # A person's conversations reuse only their own KV (the prefix cache is partitioned), and
    # take the person's turn in fair-share admission, whichever of their chats asks. A person
    # reads the answer: interactive (dashboard.chat.running lowers it while nobody watches).
    person = person_partition(conversation.user_id)
    try:
        return request_for(
            model, prompt.rendered, {}, base=answer_defaults(model),
            cache_key=f"conv-{conversation.pk}", cache_partition=person, share=person,
            arrived_wall=arrived,
        )  # fmt: skip
    except InvalidParams as exc:  # only the model's own defaults are in it: they are checked
        raise ChatRefused("invalid", f"the model's settings cannot be used: {exc}") from None
    except Refused as exc:  # images: a text that holds a media marker of its own, or too many
        raise ChatRefused("invalid", str(exc)) from None
