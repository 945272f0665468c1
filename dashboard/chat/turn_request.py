"""A chat turn's prompt and generation request: the system prompt, the turns that still fit
the context (dashboard.chat.window), the new question, rendered with the model's chat template
on the API's own path (inference.text.prompting); and the request built from it the API's way too
(inference.catalog.specs.request_for), with the chat page's answer length and prefix-cache key.

Apart from dashboard.chat.turns, which persists the turn, because building the prompt only reads: a
refusal here (a chat template that fails) leaves nothing to undo.
"""

from dataclasses import dataclass

from dashboard.chat import ChatRefused
from dashboard.chat import window as chat_window
from dashboard.models import Conversation, Message, person_partition
from inference.catalog.specs import request_for, spec_for
from inference.engine import GenerationRequest, InvalidParams
from inference.engine.params import MAX_TOKENS_LIMIT
from inference.gguf.chat_template import ChatTemplateError
from inference.models import LLMModel
from inference.text.prompting import Prompt as Rendered
from inference.text.prompting import prompt_for

MIN_ANSWER_TOKENS = 2048  # the default answer length: what the context allows, at least this
# What a chat answer uses unless the model's own default_params say otherwise (max_tokens is
# filled in per model: the engine clamps it to the room the context leaves).
CHAT_DEFAULT_PARAMS = {"temperature": 0.7}


def _said(branch: list[Message]) -> list[Message]:
    # An answer that failed before its first token says nothing.
    return [m for m in branch if m.role == Message.Role.USER or m.content]


def answer_tokens(message: Message) -> int:
    """An answer's length in tokens as measured (over all its Continues), 0 when unknown."""
    figures = message.figures or {}
    return int(figures.get("answer_tokens") or figures.get("output_tokens") or 0)


def _sized(message: Message) -> chat_window.Sized:
    tokens = answer_tokens(message) if message.role == "assistant" else None
    return chat_window.Sized(message.role, len(message.content), tokens or None)


@dataclass(slots=True)
class Prompt:
    rendered: Rendered  # the text, its BOS rule, its thinking split
    left_out: int
    context_start: int | None  # a message id; None when nothing was left out

    @property
    def text(self) -> str:
        return self.rendered.text


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
    `new` (the turn being asked). With `partial`, the last message of `new` is the assistant's
    unfinished answer, which the model continues: it is appended after the generation prompt
    instead of being rendered as a finished turn."""
    earlier = _said(earlier)
    sized = [_sized(m) for m in earlier] + [chat_window.Sized(m["role"], len(m["content"]))
                                            for m in new]  # fmt: skip
    previous = 0
    if conversation is not None and conversation.context_start_id is not None:
        ids = [m.pk for m in earlier]
        if conversation.context_start_id in ids:
            previous = ids.index(conversation.context_start_id)
    window = chat_window.choose(sized, system_chars=len(system_prompt), n_ctx=context_of(model),
                                previous_start=previous)  # fmt: skip
    kept = earlier[window.start :]
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages += [{"role": m.role, "content": m.content} for m in kept]
    rendered = new[:-1] if partial else new
    messages += rendered
    try:
        rendered = prompt_for(model, messages)
    except ChatTemplateError as exc:
        raise ChatRefused("template", f"the model's chat template failed: {exc}") from None
    left_out = min(window.start, len(earlier))
    start = earlier[window.start].pk if left_out and window.start < len(earlier) else None
    return Prompt(rendered.then(partial) if partial else rendered, left_out, start)


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
