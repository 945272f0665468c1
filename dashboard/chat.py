"""One chat turn, from a browser's frame to a saved answer.

The steps (the consumer calls 1 and 2, and stops or disconnects through Turn):
1. prepare_send / prepare_regenerate (sync, in a thread): check the user and the conversation,
   build the message list (system prompt first) and render it with the model's chat template,
   and only then persist: the user message and an assistant message in state "streaming". A
   refusal raises ChatRefused and changes nothing.
2. run_turn (async): stream the generation through the inference client, forwarding phases and
   tokens, saving the partial answer every few seconds, and at the end saving the content,
   state, figures and a RequestRecord, before the final frame goes out.
"""

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import dataclass
from importlib import import_module

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model
from django.contrib.sessions.backends.base import SessionBase
from django.db import transaction
from django.utils import timezone

from dashboard.models import Conversation, Message
from inference.engine.host import ModelSpec
from inference.engine.params import SamplingParams
from inference.gguf.chat_template import ChatTemplateError
from inference.history import record_request
from inference.models import LLMModel
from inference.prompting import render_prompt
from inference.registry import UnknownModel, resolve, spec_for
from inference.serving.client import get_client
from inference.serving.generation import Generation

log = logging.getLogger(__name__)

MAX_CONTENT_CHARS = 32_000
MAX_SYSTEM_PROMPT_CHARS = 8_000
MAX_MODEL_NAME_CHARS = 100
TITLE_CHARS = 60
PARTIAL_SAVE_EVERY_S = 2.0  # a crash loses at most this much of an answer
# What a chat answer uses unless the model's own default_params say otherwise.
CHAT_DEFAULT_PARAMS = {"temperature": 0.7, "max_tokens": 512}
_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}

Emit = Callable[[dict], Awaitable[None]]


class ChatRefused(Exception):
    """A frame asked for something this user may not or cannot do; nothing was changed."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(slots=True)
class Turn:
    """One answer being generated, shared by the consumer (stop, disconnect) and run_turn."""

    conversation_id: int
    title: str
    model_name: str
    message_id: int
    user_message_id: int | None  # None when regenerating
    replaced_message_id: int | None
    username: str
    generation: Generation
    spec: ModelSpec
    stop_reason: str = ""  # "stopped by the user" / "the browser disconnected"
    cancel_sent_to_stream: bool = False

    @property
    def request_id(self) -> str:
        return self.generation.request_id

    def announcement(self) -> dict:
        """The "conversation" frame that opens a turn."""
        return {
            "type": "conversation",
            "id": self.conversation_id,
            "title": self.title,
            "model": self.model_name,
            "message_id": self.message_id,
            "user_message_id": self.user_message_id,
            "replaced_message_id": self.replaced_message_id,
            "request_id": self.request_id,
        }


# Conversations with a turn running in this process: a second one at the same time (another
# tab) would interleave answers and fight over the prefix cache entry.
_active: set[int] = set()
_active_lock = threading.Lock()


def is_active(conversation_id: int) -> bool:
    with _active_lock:
        return conversation_id in _active


def _claim(conversation_id: int) -> None:
    with _active_lock:
        if conversation_id in _active:
            raise ChatRefused("busy", "this conversation is already answering in another window")
        _active.add(conversation_id)


def _release(conversation_id: int) -> None:
    with _active_lock:
        _active.discard(conversation_id)


# --- 1. preparing a turn (sync: runs in a thread) ------------------------------------------------


def _check_user(user_id: int, session: SessionBase | None) -> object:
    """The user again, from the database: a socket outlives a logout, an expired session or a
    deactivation, and each of those must end its chat too."""
    user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
    if user is None:
        raise ChatRefused("unauthorized", "your account is not active")
    key = session.session_key if session is not None else None
    # A fresh read of the stored session: load() gives {} for one deleted or expired.
    store = import_module(settings.SESSION_ENGINE).SessionStore
    stored = store(session_key=key).load() if key else {}
    if str(stored.get(SESSION_KEY)) != str(user_id):
        raise ChatRefused("unauthorized", "you have been logged out; log in again")
    return user


def _own_conversation(user, conversation_id: int) -> Conversation:
    conversation = Conversation.objects.filter(pk=conversation_id, user=user).first()
    if conversation is None:  # someone else's reads the same as a missing one
        raise ChatRefused("not_found", "no such conversation")
    return conversation


def _model(name: str | None) -> LLMModel:
    try:
        return resolve(name or None)
    except UnknownModel as exc:
        raise ChatRefused("unknown_model", str(exc)) from None


def _history(conversation: Conversation | None, system_prompt: str, *, exclude: int | None = None):
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    if conversation is not None and conversation.pk:
        for message in conversation.messages.exclude(pk=exclude).only("role", "content"):
            if message.role == Message.Role.ASSISTANT and not message.content:
                continue  # an answer that failed before its first token says nothing
            messages.append({"role": message.role, "content": message.content})
    return messages


def _render(model: LLMModel, messages: list[dict]) -> str:
    try:
        return render_prompt(model, messages)
    except ChatTemplateError as exc:
        raise ChatRefused("template", f"the model's chat template failed: {exc}") from None


def _generation(
    model: LLMModel, prompt: str, conversation: Conversation, arrived: float
) -> Generation:
    params = {**CHAT_DEFAULT_PARAMS, **(model.default_params or {})}
    params = {key: value for key, value in params.items() if key in _SAMPLING_FIELDS}
    # A person's conversations reuse only their own KV (the prefix cache is partitioned).
    return Generation(
        model=model.name, prompt=prompt, params=params, cache_key=f"conv-{conversation.pk}",
        cache_partition=f"user:{conversation.user_id}", accepted_wall=arrived,
    )  # fmt: skip


def _title(content: str) -> str:
    line = " ".join(content.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


def prepare_send(
    user_id: int,
    session: SessionBase | None,
    *,
    conversation_id: int | None,
    content: str,
    model_name: str | None,
    system_prompt: str | None,
) -> Turn:
    arrived = time.time()  # the turn's clock starts before the checks and the prompt rendering
    user = _check_user(user_id, session)
    conversation = _own_conversation(user, conversation_id) if conversation_id else None
    model = _model(model_name or (conversation.model_name if conversation else None))
    if system_prompt is None:
        system_prompt = conversation.system_prompt if conversation else ""
    prompt_messages = [*_history(conversation, system_prompt), {"role": "user", "content": content}]
    prompt = _render(model, prompt_messages)

    claimed: list[int] = []
    try:
        with transaction.atomic():
            if conversation is None:
                conversation = Conversation.objects.create(
                    user=user, title=_title(content), model_name=model.name,
                    system_prompt=system_prompt,
                )  # fmt: skip
            else:
                conversation.model_name = model.name
                conversation.system_prompt = system_prompt
                conversation.save(update_fields=["model_name", "system_prompt", "updated_at"])
            _claim(conversation.pk)
            claimed.append(conversation.pk)
            generation = _generation(model, prompt, conversation, arrived)
            asked = Message.objects.create(
                conversation=conversation, role=Message.Role.USER, content=content
            )
            answer = Message.objects.create(
                conversation=conversation, role=Message.Role.ASSISTANT,
                state=Message.State.STREAMING, request_id=generation.request_id,
            )  # fmt: skip
    except BaseException:
        for pk in claimed:
            _release(pk)
        raise
    return Turn(
        conversation_id=conversation.pk, title=conversation.title, model_name=model.name,
        message_id=answer.pk, user_message_id=asked.pk, replaced_message_id=None,
        username=user.get_username(), generation=generation, spec=spec_for(model),
    )  # fmt: skip


def prepare_regenerate(user_id: int, session: SessionBase | None, *, conversation_id: int) -> Turn:
    """Replace the conversation's last answer with a new one (or answer a last, unanswered
    question)."""
    arrived = time.time()  # the turn's clock starts before the checks and the prompt rendering
    user = _check_user(user_id, session)
    conversation = _own_conversation(user, conversation_id)
    last = conversation.messages.last()
    replaced = last if last is not None and last.role == Message.Role.ASSISTANT else None
    replaced_id = replaced.pk if replaced else None  # delete() clears pk
    messages = _history(conversation, conversation.system_prompt, exclude=replaced_id)
    if not messages or messages[-1]["role"] != "user":
        raise ChatRefused("nothing_to_regenerate", "there is no question to answer again")
    model = _model(conversation.model_name)
    prompt = _render(model, messages)

    _claim(conversation.pk)
    try:
        with transaction.atomic():
            generation = _generation(model, prompt, conversation, arrived)
            if replaced is not None:
                replaced.delete()
            answer = Message.objects.create(
                conversation=conversation, role=Message.Role.ASSISTANT,
                state=Message.State.STREAMING, request_id=generation.request_id,
            )  # fmt: skip
            conversation.model_name = model.name
            conversation.save(update_fields=["model_name", "updated_at"])
    except BaseException:
        _release(conversation.pk)
        raise
    return Turn(
        conversation_id=conversation.pk, title=conversation.title, model_name=model.name,
        message_id=answer.pk, user_message_id=None,
        replaced_message_id=replaced_id,
        username=user.get_username(), generation=generation, spec=spec_for(model),
    )  # fmt: skip


# --- 2. running a turn ---------------------------------------------------------------------------


def save_partial(message_id: int, content: str) -> None:
    Message.objects.filter(pk=message_id, state=Message.State.STREAMING).update(content=content)


def save_answer(turn: Turn, content: str, final: dict | None) -> dict:
    """Store the answer and its figures; returns the frame that ends the turn."""
    figures = (final or {}).get("figures") or {}
    if final is not None and final.get("type") == "done":
        reason = final.get("finish_reason") or "stop"
        state = Message.State.STOPPED if reason == "cancelled" else Message.State.COMPLETE
        error = (turn.stop_reason or "stopped") if reason == "cancelled" else ""
        outcome = reason
    else:
        reason = "error"
        state = Message.State.FAILED
        error = (final or {}).get("message") or "the inference worker stopped answering"
        outcome = "error"
    Message.objects.filter(pk=turn.message_id).update(
        content=content, state=state, error=error, figures=figures
    )
    Conversation.objects.filter(pk=turn.conversation_id).update(updated_at=timezone.now())
    record_request(
        request_id=turn.request_id, model_name=turn.model_name, source="chat",
        client=turn.username, figures=figures, outcome=outcome, error=error if
        state == Message.State.FAILED else "", accepted_wall=turn.generation.accepted_wall,
    )  # fmt: skip
    if state == Message.State.FAILED:
        return {"type": "error", "code": (final or {}).get("code") or "failed", "message": error,
                "message_id": turn.message_id, "figures": figures}  # fmt: skip
    return {"type": "done", "finish_reason": reason, "state": state, "error": error,
            "figures": figures, "message_id": turn.message_id}  # fmt: skip


async def cancel(turn: Turn, reason: str) -> None:
    """Stop the generation at once; the stream then ends with finish_reason "cancelled"."""
    turn.stop_reason = turn.stop_reason or reason
    await get_client().cancel(turn.request_id)


async def run_turn(turn: Turn, emit: Emit) -> dict:
    """Stream one answer to `emit` and save it; returns (and emits) the final frame."""
    client = get_client()
    parts: list[str] = []
    final: dict | None = None
    last_save = time.monotonic()
    try:
        async with aclosing(client.stream(turn.generation, turn.spec)) as events:
            async for event in events:
                # A stop that came before the engine had the request (the model still loading)
                # found nothing to cancel: the first event means it is there now.
                if turn.stop_reason and not turn.cancel_sent_to_stream:
                    turn.cancel_sent_to_stream = True
                    await client.cancel(turn.request_id)
                kind = event.get("type")
                if kind == "token":
                    if event.get("text"):
                        parts.append(event["text"])
                        await emit({"type": "token", "text": event["text"]})
                    if time.monotonic() - last_save >= PARTIAL_SAVE_EVERY_S:
                        last_save = time.monotonic()
                        await database_sync_to_async(save_partial)(turn.message_id, "".join(parts))
                elif kind == "phase":
                    await emit({"type": "phase", "phase": event.get("phase")})
                elif kind in ("done", "error"):
                    final = event
                    break
    except asyncio.CancelledError:
        # Cancelled from outside (the consumer gave up waiting): keep what was generated.
        turn.stop_reason = turn.stop_reason or "the connection closed"
        await _finish(turn, parts, {"type": "done", "finish_reason": "cancelled", "figures": {}})
        raise
    except Exception:  # noqa: BLE001 - the answer is marked failed; the socket stays usable
        log.exception("chat turn %s failed", turn.request_id)
        final = None
    frame = await _finish(turn, parts, final)
    await emit(frame)
    return frame


async def _finish(turn: Turn, parts: list[str], final: dict | None) -> dict:
    try:
        return await database_sync_to_async(save_answer)(turn, "".join(parts), final)
    finally:
        _release(turn.conversation_id)
