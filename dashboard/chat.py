"""One chat turn, from a browser's frame to a saved answer.

The steps (the consumer calls 1 and 2, and stops, attaches and detaches through Turn):
1. prepare_send / prepare_edit / prepare_regenerate / prepare_continue (sync, in a thread):
   check the user and the conversation, build the message list (system prompt first, then the
   turns that fit the context: dashboard.chat_window) and render it with the model's chat
   template, and only then persist: the user message and an assistant message in state
   "streaming" (Continue writes on into the answer it continues). A refusal raises ChatRefused
   and changes nothing.
2. run_turn (async, a task of its own): stream the generation through the inference client,
   publishing phases, progress and tokens to whichever sockets are attached, saving the partial
   answer every few seconds, and at the end saving the content, state, figures and a
   RequestRecord, before the final frame goes out.

A turn belongs to its conversation, not to a socket: a socket that goes away (a reload, a
phone locking) only detaches, the answer runs on to its end (its length limit bounds it), and a
new socket of the same user attaches and gets the text so far, then the rest live. Stop still
cancels. Running answers per user are capped (dashboard.limits.chat_answers).
"""

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from importlib import import_module

from channels.db import database_sync_to_async
from django.conf import settings
from django.contrib.auth import SESSION_KEY, get_user_model
from django.contrib.sessions.backends.base import SessionBase
from django.db import transaction
from django.utils import timezone

from dashboard import chat_window
from dashboard.limits import chat_answers
from dashboard.models import Conversation, Message, newest_leaf, versions
from inference.engine.host import ModelSpec
from inference.engine.params import MAX_TOKENS_LIMIT, SamplingParams
from inference.gguf.chat_template import ChatTemplateError
from inference.history import record_request
from inference.models import LLMModel
from inference.prompting import render_prompt
from inference.registry import UnknownModel, resolve, spec_for
from inference.serving.client import get_client
from inference.serving.generation import Generation
from inference.thinking import ThinkingSplitter, prompt_opens_thinking, thinking_mode

log = logging.getLogger(__name__)

MAX_CONTENT_CHARS = 100_000  # a long paste; the context's token limit is checked by the engine
MAX_SYSTEM_PROMPT_CHARS = 8_000
MAX_MODEL_NAME_CHARS = 100
MAX_TITLE_CHARS = 200  # Conversation.title's column
TITLE_CHARS = 60
PARTIAL_SAVE_EVERY_S = 2.0  # a crash loses at most this much of an answer
MIN_ANSWER_TOKENS = 2048  # the default answer length: what the context allows, at least this
# What a chat answer uses unless the model's own default_params say otherwise (max_tokens is
# filled in per model: the engine clamps it to the room the context leaves).
CHAT_DEFAULT_PARAMS = {"temperature": 0.7}
_SAMPLING_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
_STATUS_FIELDS = ("phase", "ahead", "done", "total", "cached")

Subscriber = Callable[[dict], None]  # must not block: a socket's outbox


class ChatRefused(Exception):
    """A frame asked for something this user may not or cannot do; nothing was changed."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(slots=True)
class Turn:
    """One answer being generated; lives while it runs, whoever is watching."""

    conversation_id: int
    user_id: int
    title: str
    model_name: str
    message_id: int
    user_message_id: int | None  # None when regenerating or continuing
    replaced_message_id: int | None  # the answer a regenerate set aside (kept as a version)
    truncate_from: int | None  # the page drops this message and those after it (edit)
    username: str
    generation: Generation
    spec: ModelSpec
    kind: str = "send"  # send / edit / regenerate / continue
    prefix: str = ""  # the text a Continue writes on from
    prefix_tokens: int = 0  # and its length in tokens, when measured
    left_out: int = 0  # older messages of the branch the model no longer reads
    context_start: int | None = None  # the first message it still reads (None: all)
    stop_reason: str = ""  # "stopped by the user" / "the connection closed"
    cancel_sent_to_stream: bool = False
    parts: list[str] = field(default_factory=list)
    # A thinking model's <think> block, split off the answer as it streams (inference.thinking).
    splitter: ThinkingSplitter | None = None
    thinking_parts: list[str] = field(default_factory=list)
    thinking_started: float | None = None
    thinking_s: float | None = None  # from its first thought to its first word of answer
    status: dict | None = None  # the last phase or progress frame, for a socket that attaches
    subscribers: list[Subscriber] = field(default_factory=list)
    task: asyncio.Task | None = None
    final: dict | None = None

    @property
    def request_id(self) -> str:
        return self.generation.request_id

    @property
    def running(self) -> bool:
        return self.final is None

    @property
    def text(self) -> str:
        return self.prefix + "".join(self.parts)

    @property
    def thinking(self) -> str:
        return "".join(self.thinking_parts)

    def take(self, text: str) -> None:
        """A piece of the model's output: thinking and answer published apart."""
        thought, said = self.splitter.feed(text) if self.splitter else ("", text)
        self._add(thought, said)

    def end_of_output(self) -> None:
        if self.splitter is not None:
            self._add(*self.splitter.finish())
        if self.thinking_started is not None and self.thinking_s is None:
            self.thinking_s = time.monotonic() - self.thinking_started

    def _add(self, thought: str, said: str) -> None:
        if thought:
            if self.thinking_started is None:
                self.thinking_started = time.monotonic()
            self.thinking_parts.append(thought)
            self.publish({"type": "thinking", "text": thought})
        if said:
            if self.thinking_started is not None and self.thinking_s is None:
                self.thinking_s = time.monotonic() - self.thinking_started
            self.parts.append(said)
            self.publish({"type": "token", "text": said})

    def announcement(self, *, attached: bool = False) -> dict:
        """The "conversation" frame that opens a turn (or a socket's view of a running one)."""
        return {
            "type": "conversation",
            "id": self.conversation_id,
            "title": self.title,
            "model": self.model_name,
            "kind": self.kind,
            "attached": attached,
            "message_id": self.message_id,
            "user_message_id": self.user_message_id,
            "replaced_message_id": self.replaced_message_id,
            "truncate_from": self.truncate_from,
            "left_out": self.left_out,
            "context_start": self.context_start,
            "request_id": self.request_id,
        }

    def snapshot(self) -> dict:
        """Everything so far, for a socket that attaches mid-answer."""
        return {"type": "snapshot", "message_id": self.message_id, "text": self.text,
                "thinking": self.thinking, "status": self.status}  # fmt: skip

    def publish(self, frame: dict) -> None:
        for subscriber in list(self.subscribers):
            subscriber(frame)

    def subscribe(self, subscriber: Subscriber, *, replay: bool) -> None:
        """Start sending this turn's frames to `subscriber`; with `replay`, first the opening
        and the text so far. Synchronous, so no frame can slip in between."""
        if replay:
            subscriber(self.announcement(attached=True))
            subscriber(self.snapshot())
        self.subscribers.append(subscriber)

    def unsubscribe(self, subscriber: Subscriber) -> None:
        if subscriber in self.subscribers:
            self.subscribers.remove(subscriber)


# Conversations with a turn in this process: a second one at the same time (another tab)
# would interleave answers and fight over the prefix cache entry. None while it is prepared.
_turns: dict[int, Turn | None] = {}
_turns_lock = threading.Lock()


def is_active(conversation_id: int) -> bool:
    with _turns_lock:
        return conversation_id in _turns


def running_turn(conversation_id: int) -> Turn | None:
    with _turns_lock:
        return _turns.get(conversation_id)


def running_turns() -> list[Turn]:
    with _turns_lock:
        return [turn for turn in _turns.values() if turn is not None]


def _claim(conversation_id: int, user_id: int) -> None:
    with _turns_lock:
        if conversation_id in _turns:
            raise ChatRefused("busy", "this conversation is already answering in another window")
        cap = settings.MAX_SOCKETS_PER_USER
        if not chat_answers.take(f"user:{user_id}", cap):
            raise ChatRefused("too_many", f"you have {cap} answers running already; stop one "
                              "or wait for it to finish")  # fmt: skip
        _turns[conversation_id] = None


def _register(turn: Turn) -> None:
    with _turns_lock:
        _turns[turn.conversation_id] = turn


def _release(conversation_id: int, user_id: int) -> None:
    with _turns_lock:
        if _turns.pop(conversation_id, False) is not False:
            chat_answers.give_back(f"user:{user_id}")


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


def own_conversation(user, conversation_id: int) -> Conversation:
    conversation = Conversation.objects.filter(pk=conversation_id, user=user).first()
    if conversation is None:  # someone else's reads the same as a missing one
        raise ChatRefused("not_found", "no such conversation")
    return conversation


def _model(name: str | None) -> LLMModel:
    try:
        return resolve(name or None)
    except UnknownModel as exc:
        raise ChatRefused("unknown_model", str(exc)) from None


def _said(branch: list[Message]) -> list[Message]:
    # An answer that failed before its first token says nothing.
    return [m for m in branch if m.role == Message.Role.USER or m.content]


def _answer_tokens(message: Message) -> int:
    """An answer's length in tokens as measured (over all its Continues), 0 when unknown."""
    figures = message.figures or {}
    return int(figures.get("answer_tokens") or figures.get("output_tokens") or 0)


def _sized(message: Message) -> chat_window.Sized:
    tokens = _answer_tokens(message) if message.role == "assistant" else None
    return chat_window.Sized(message.role, len(message.content), tokens or None)


@dataclass(slots=True)
class _Prompt:
    text: str
    left_out: int
    context_start: int | None  # a message id; None when nothing was left out


def _prompt(
    model: LLMModel,
    conversation: Conversation | None,
    system_prompt: str,
    earlier: list[Message],
    new: list[dict],
    *,
    partial: str = "",
) -> _Prompt:
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
        text = render_prompt(model, messages)
    except ChatTemplateError as exc:
        raise ChatRefused("template", f"the model's chat template failed: {exc}") from None
    left_out = min(window.start, len(earlier))
    start = earlier[window.start].pk if left_out and window.start < len(earlier) else None
    return _Prompt(text + partial, left_out, start)


def context_of(model: LLMModel) -> int:
    """Tokens per sequence the model gets: its setting, or for "automatic" (0) what the
    preflight would size it to now (its training context as far as memory allows)."""
    if model.n_ctx:
        return model.n_ctx
    try:
        from inference.preflight import automatic_ctx, gguf_info  # reads the GGUF header only

        return automatic_ctx(gguf_info(model.file_path), spec_for(model).config)
    except Exception:  # noqa: BLE001 - a missing or unreadable file: the load will say why
        return model.context_length or 2048


def _answer_params(model: LLMModel) -> dict:
    room = max(MIN_ANSWER_TOKENS, context_of(model))  # the engine clamps it to the room left
    params = {**CHAT_DEFAULT_PARAMS, "max_tokens": min(room, MAX_TOKENS_LIMIT),
              **(model.default_params or {})}  # fmt: skip
    return {key: value for key, value in params.items() if key in _SAMPLING_FIELDS}


def _generation(
    model: LLMModel, prompt: str, conversation: Conversation, arrived: float
) -> Generation:
    # A person's conversations reuse only their own KV (the prefix cache is partitioned).
    return Generation(
        model=model.name, prompt=prompt, params=_answer_params(model),
        cache_key=f"conv-{conversation.pk}", cache_partition=f"user:{conversation.user_id}",
        accepted_wall=arrived,
    )  # fmt: skip


def _title(content: str) -> str:
    line = " ".join(content.split())
    return line if len(line) <= TITLE_CHARS else line[: TITLE_CHARS - 1] + "…"


def _open_answer(conversation, parent, model, generation) -> Message:
    return Message.objects.create(
        conversation=conversation, parent=parent, role=Message.Role.ASSISTANT,
        state=Message.State.STREAMING, request_id=generation.request_id, model_name=model.name,
    )  # fmt: skip


def _turn(
    conversation, user, model, generation, prompt: _Prompt, answer, *, kind: str,
    user_message_id: int | None = None, replaced_message_id: int | None = None,
    truncate_from: int | None = None, prefix: str = "", prefix_tokens: int = 0,
) -> Turn:  # fmt: skip
    # A Continue writes on into the answer itself, past any thinking.
    thinks = kind != "continue" and thinking_mode(model.effective_chat_template)
    splitter = ThinkingSplitter(inside=prompt_opens_thinking(prompt.text)) if thinks else None
    return Turn(
        conversation_id=conversation.pk, user_id=user.pk, title=conversation.title,
        model_name=model.name, message_id=answer.pk, user_message_id=user_message_id,
        replaced_message_id=replaced_message_id, truncate_from=truncate_from,
        username=user.get_username(), generation=generation, spec=spec_for(model), kind=kind,
        prefix=prefix, prefix_tokens=prefix_tokens, left_out=prompt.left_out,
        context_start=prompt.context_start, splitter=splitter,
    )  # fmt: skip


@dataclass(slots=True)
class _Claim:
    """Holds a conversation's claim while a turn is prepared; released unless handed over."""

    user_id: int
    conversation_id: int | None = None

    def take(self, conversation_id: int) -> None:
        _claim(conversation_id, self.user_id)
        self.conversation_id = conversation_id

    def drop(self) -> None:
        if self.conversation_id is not None:
            _release(self.conversation_id, self.user_id)


def _save_window(conversation: Conversation, prompt: _Prompt) -> None:
    conversation.context_start_id = prompt.context_start
    conversation.save(update_fields=["context_start", "model_name", "system_prompt", "leaf",
                                     "updated_at"])  # fmt: skip


def _ask(
    user,
    conversation: Conversation | None,
    *,
    parent_of_question,
    earlier,
    content,
    model,
    system_prompt,
    arrived,
    kind,
    truncate_from=None,
) -> Turn:
    """A new question and its answer, under `parent_of_question` (shared by send and edit)."""
    prompt = _prompt(model, conversation, system_prompt, earlier,
                     [{"role": "user", "content": content}])  # fmt: skip
    claim = _Claim(user.pk)
    try:
        with transaction.atomic():
            if conversation is None:
                conversation = Conversation.objects.create(
                    user=user, title=_title(content), model_name=model.name,
                    system_prompt=system_prompt,
                )  # fmt: skip
            claim.take(conversation.pk)
            generation = _generation(model, prompt.text, conversation, arrived)
            asked = Message.objects.create(conversation=conversation, parent=parent_of_question,
                                           role=Message.Role.USER, content=content)  # fmt: skip
            answer = _open_answer(conversation, asked, model, generation)
            conversation.model_name = model.name
            conversation.system_prompt = system_prompt
            conversation.leaf = answer
            _save_window(conversation, prompt)
            turn = _turn(
                conversation,
                user,
                model,
                generation,
                prompt,
                answer,
                user_message_id=asked.pk,
                truncate_from=truncate_from,
                kind=kind,
            )
    except BaseException:
        claim.drop()
        raise
    _register(turn)
    return turn


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
    conversation = own_conversation(user, conversation_id) if conversation_id else None
    model = _model(model_name or (conversation.model_name if conversation else None))
    if system_prompt is None:
        system_prompt = conversation.system_prompt if conversation else ""
    branch = []
    if conversation is not None:
        conversation.adopt_linear()
        branch = conversation.path()
    return _ask(user, conversation, parent_of_question=branch[-1] if branch else None,
                earlier=branch, content=content, model=model, system_prompt=system_prompt,
                arrived=arrived, kind="send")  # fmt: skip


def prepare_edit(
    user_id: int, session: SessionBase | None, *, conversation_id: int, message_id: int,
    content: str,
) -> Turn:  # fmt: skip
    """Ask an edited version of one of the branch's questions: a sibling of the old one, so the
    old question and everything after it stay as a version to flip back to."""
    arrived = time.time()
    user = _check_user(user_id, session)
    conversation = own_conversation(user, conversation_id)
    conversation.adopt_linear()
    branch = conversation.path()
    index = next((i for i, m in enumerate(branch) if m.pk == message_id), None)
    if index is None or branch[index].role != Message.Role.USER:
        raise ChatRefused("not_found", "no such question in this conversation")
    edited = branch[index]
    model = _model(conversation.model_name)
    return _ask(user, conversation, parent_of_question=edited.parent, earlier=branch[:index],
                content=content, model=model, system_prompt=conversation.system_prompt,
                arrived=arrived, kind="edit", truncate_from=edited.pk)  # fmt: skip


def prepare_regenerate(user_id: int, session: SessionBase | None, *, conversation_id: int) -> Turn:
    """A new answer to the branch's last question; the one it replaces stays as a version (or
    answer a last, unanswered question)."""
    arrived = time.time()  # the turn's clock starts before the checks and the prompt rendering
    user = _check_user(user_id, session)
    conversation = own_conversation(user, conversation_id)
    conversation.adopt_linear()
    branch = conversation.path()
    replaced = branch[-1] if branch and branch[-1].role == Message.Role.ASSISTANT else None
    earlier = branch[:-1] if replaced else branch
    if not earlier or earlier[-1].role != Message.Role.USER:
        raise ChatRefused("nothing_to_regenerate", "there is no question to answer again")
    question = earlier[-1]
    model = _model(conversation.model_name)
    prompt = _prompt(model, conversation, conversation.system_prompt, earlier[:-1],
                     [{"role": "user", "content": question.content}])  # fmt: skip
    claim = _Claim(user.pk)
    try:
        with transaction.atomic():
            claim.take(conversation.pk)
            generation = _generation(model, prompt.text, conversation, arrived)
            answer = _open_answer(conversation, question, model, generation)
            conversation.model_name = model.name
            conversation.leaf = answer
            _save_window(conversation, prompt)
            turn = _turn(conversation, user, model, generation, prompt, answer, kind="regenerate",
                         replaced_message_id=replaced.pk if replaced else None)  # fmt: skip
    except BaseException:
        claim.drop()
        raise
    _register(turn)
    return turn


def prepare_continue(user_id: int, session: SessionBase | None, *, conversation_id: int) -> Turn:
    """Write on from the branch's last answer: the prompt is the conversation with that answer
    as the assistant's unfinished turn, and what the model writes is appended to it."""
    arrived = time.time()
    user = _check_user(user_id, session)
    conversation = own_conversation(user, conversation_id)
    conversation.adopt_linear()
    branch = conversation.path()
    answer = branch[-1] if branch else None
    if (len(branch) < 2 or branch[-1].role != Message.Role.ASSISTANT or not answer.content
            or branch[-2].role != Message.Role.USER):  # fmt: skip
        raise ChatRefused("nothing_to_continue", "there is no answer to continue")
    question = branch[-2]
    model = _model(answer.model_name or conversation.model_name)
    prompt = _prompt(model, conversation, conversation.system_prompt, branch[:-2],
                     [{"role": "user", "content": question.content},
                      {"role": "assistant", "content": answer.content}],
                     partial=answer.content)  # fmt: skip
    claim = _Claim(user.pk)
    try:
        with transaction.atomic():
            claim.take(conversation.pk)
            generation = _generation(model, prompt.text, conversation, arrived)
            Message.objects.filter(pk=answer.pk).update(
                state=Message.State.STREAMING, error="", request_id=generation.request_id,
                model_name=model.name,
            )  # fmt: skip
            conversation.model_name = model.name
            _save_window(conversation, prompt)
            turn = _turn(conversation, user, model, generation, prompt, answer, kind="continue",
                         prefix=answer.content, prefix_tokens=_answer_tokens(answer))  # fmt: skip
    except BaseException:
        claim.drop()
        raise
    _register(turn)
    return turn


# --- conversations: the branch on show, versions, rename -------------------------------------


def message_data(message: Message, messages: list[Message]) -> dict:
    """A message as the page gets it (the page's initial data and a switch's reply)."""
    state, error = message.state, message.error
    if state == Message.State.STREAMING and not is_active(message.conversation_id):
        # Left "streaming" by a process that ended mid-answer: it will never finish.
        state, error = Message.State.STOPPED, "interrupted: the appliance restarted"
    figures = message.figures or {}
    siblings = versions(message, messages)
    return {
        "id": message.pk,
        "role": message.role,
        "content": message.content,
        "thinking": message.thinking,
        "state": state,
        "error": error,
        "model": message.model_name,
        "figures": {key: figures.get(key) for key in FIGURE_KEYS if key in figures},
        "versions": [m.pk for m in siblings],
    }


FIGURE_KEYS = (
    "ttft", "prompt_tps", "decode_tps", "prompt_tokens", "cached_tokens", "output_tokens",
    "queue_time", "load_time", "prefill_time", "total_time", "finish_reason", "answer_tokens",
    "thinking_s",
)  # fmt: skip


def branch_data(conversation: Conversation) -> dict:
    messages = list(conversation.messages.all())
    branch = conversation.path(messages)
    # Saved before versions (no leaf): one line of messages, each its only version.
    versioned = conversation.leaf_id is not None
    return {"messages": [message_data(m, messages if versioned else [m]) for m in branch],
            "context_start": conversation.context_start_id}  # fmt: skip


def switch_version(user_id: int, session, *, conversation_id: int, message_id: int) -> dict:
    """Show another version of a turn: the newest branch under it becomes the one on show."""
    user = _check_user(user_id, session)
    conversation = own_conversation(user, conversation_id)
    if is_active(conversation.pk):
        raise ChatRefused("busy", "an answer is still streaming; stop it first")
    conversation.adopt_linear()
    messages = list(conversation.messages.all())
    target = next((m for m in messages if m.pk == message_id), None)
    if target is None:
        raise ChatRefused("not_found", "no such message in this conversation")
    conversation.leaf = newest_leaf(target, messages)
    conversation.save(update_fields=["leaf"])
    return {"type": "branch", "id": conversation.pk, **branch_data(conversation)}


def rename(user_id: int, session, *, conversation_id: int, title: str) -> dict:
    user = _check_user(user_id, session)
    conversation = own_conversation(user, conversation_id)
    conversation.title = " ".join(title.split())[:MAX_TITLE_CHARS] or conversation.title
    conversation.save(update_fields=["title"])
    return {"type": "renamed", "id": conversation.pk, "title": conversation.title}


def check_attach(user_id: int, session, *, conversation_id: int) -> dict:
    """Only the conversation's owner may watch its answer; returns the branch as saved, for
    when nothing runs any more."""
    conversation = own_conversation(_check_user(user_id, session), conversation_id)
    return branch_data(conversation)


# --- 2. running a turn ---------------------------------------------------------------------------


def save_partial(message_id: int, content: str) -> None:
    Message.objects.filter(pk=message_id, state=Message.State.STREAMING).update(content=content)


def save_answer(turn: Turn, content: str, final: dict | None) -> dict:
    """Store the answer and its figures; returns the frame that ends the turn."""
    figures = dict((final or {}).get("figures") or {})
    if turn.prefix_tokens and figures.get("output_tokens") is not None:
        figures["answer_tokens"] = turn.prefix_tokens + figures["output_tokens"]
    if turn.thinking_s is not None:
        figures["thinking_s"] = round(turn.thinking_s, 2)
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
    done = {"content": content, "state": state, "error": error, "figures": figures}
    if turn.splitter is not None:
        done["thinking"] = turn.thinking
    Message.objects.filter(pk=turn.message_id).update(**done)
    Conversation.objects.filter(pk=turn.conversation_id).update(updated_at=timezone.now())
    record_request(
        request_id=turn.request_id, model_name=turn.model_name, source="chat",
        client=turn.username, figures=figures, outcome=outcome, error=error if
        state == Message.State.FAILED else "", accepted_wall=turn.generation.accepted_wall,
    )  # fmt: skip
    if state == Message.State.FAILED:
        return {"type": "error", "code": (final or {}).get("code") or "failed", "message": error,
                "message_id": turn.message_id, "figures": figures, "text": content,
                "thinking": turn.thinking}  # fmt: skip
    return {"type": "done", "finish_reason": reason, "state": state, "error": error,
            "figures": figures, "message_id": turn.message_id, "text": content,
            "thinking": turn.thinking}  # fmt: skip


async def cancel(turn: Turn, reason: str) -> None:
    """Stop the generation at once; the stream then ends with finish_reason "cancelled"."""
    turn.stop_reason = turn.stop_reason or reason
    await get_client().cancel(turn.request_id)


def _status(event: dict) -> dict:
    frame = {"type": event["type"]}
    frame.update({key: event[key] for key in _STATUS_FIELDS if key in event})
    return frame


def start(turn: Turn) -> asyncio.Task:
    """Run the turn in a task of its own: it outlives the socket that asked for it."""
    turn.task = asyncio.create_task(run_turn(turn), name=turn.request_id)
    return turn.task


async def run_turn(turn: Turn) -> dict:
    """Stream one answer to the turn's subscribers and save it; returns the final frame."""
    client = get_client()
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
                        turn.take(event["text"])
                    if time.monotonic() - last_save >= PARTIAL_SAVE_EVERY_S:
                        last_save = time.monotonic()
                        await database_sync_to_async(save_partial)(turn.message_id, turn.text)
                elif kind in ("phase", "progress"):
                    turn.status = _status(event)
                    turn.publish(turn.status)
                elif kind in ("done", "error"):
                    final = event
                    break
    except asyncio.CancelledError:
        # Cancelled from outside (the server shutting down): keep what was generated.
        turn.stop_reason = turn.stop_reason or "the connection closed"
        await _finish(turn, {"type": "done", "finish_reason": "cancelled", "figures": {}})
        raise
    except Exception:  # noqa: BLE001 - the answer is marked failed; the socket stays usable
        log.exception("chat turn %s failed", turn.request_id)
        final = None
    return await _finish(turn, final)


async def _finish(turn: Turn, final: dict | None) -> dict:
    turn.end_of_output()
    frame = {"type": "error", "code": "internal", "message": "the answer could not be saved",
             "message_id": turn.message_id, "figures": {}, "text": turn.text}  # fmt: skip
    try:
        frame = await database_sync_to_async(save_answer)(turn, turn.text, final)
    finally:
        _release(turn.conversation_id, turn.user_id)
        turn.final = frame
        turn.publish(frame)
    return frame
