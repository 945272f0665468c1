"""Running answers: the Turn that streams one answer to whichever sockets watch it, the
turns running in this process, and saving what they generated.

Apart from dashboard.chat (which prepares a turn and hands it here) because this is the part that
outlives a socket: a turn belongs to its conversation, runs on when its socket goes away, and a
new socket of the same user attaches to it. Running answers per user are capped
(dashboard.limits.chat_answers).

While no socket watches it, nobody reads the answer: it runs as background work (so a long story
left behind in a closed tab does not slow the people who are reading), and as what it asked for
again when a socket attaches (Turn.priority, told to the engine by tell_priority).
"""

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from contextlib import aclosing
from dataclasses import dataclass, field

from channels.db import database_sync_to_async
from django.conf import settings
from django.utils import timezone

from dashboard.chat import ChatRefused
from dashboard.limits import chat_answers
from dashboard.models import Conversation, Message
from dashboard.wire import FirstOutput
from inference.engine import GenerationRequest
from inference.engine.generation import Priority
from inference.engine.host import ModelSpec
from inference.history import record_answer
from inference.serving.client import get_client
from inference.text.thinking import ThinkingSplitter

log = logging.getLogger(__name__)

PARTIAL_SAVE_EVERY_S = 2.0  # a crash loses at most this much of an answer
_STATUS_FIELDS = ("phase", "ahead", "done", "total", "cached")

Subscriber = Callable[[dict], None]  # must not block: a socket's outbox


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
    request: GenerationRequest
    spec: ModelSpec
    kind: str = "send"  # send / edit / regenerate / continue
    prefix: str = ""  # the text a Continue writes on from
    prefix_tokens: int = 0  # and its length in tokens, when measured
    left_out: int = 0  # older messages of the branch the model no longer reads
    context_start: int | None = None  # the first message it still reads (None: all)
    stop_reason: str = ""  # "stopped by the user" / "the connection closed"
    cancel_sent_to_stream: bool = False
    parts: list[str] = field(default_factory=list)
    # A thinking model's <think> block, split off the answer as it streams
    # (inference.text.thinking).
    splitter: ThinkingSplitter | None = None
    thinking_parts: list[str] = field(default_factory=list)
    thinking_started: float | None = None
    thinking_s: float | None = None  # from its first thought to its first word of answer
    status: dict | None = None  # the last phase or progress frame, for a socket that attaches
    first_output: FirstOutput = field(default_factory=FirstOutput)  # stamped by the socket
    subscribers: list[Subscriber] = field(default_factory=list)
    task: asyncio.Task | None = None
    final: dict | None = None
    in_engine: bool = False  # an event of the engine's came: it has the request
    told: Priority | None = None  # the priority the engine was last told; None: as asked
    telling: asyncio.Task | None = None  # tell_priority, while it runs

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def priority(self) -> Priority:
        """What the answer should run at: as asked while a socket watches it, background while
        none does."""
        return self.request.priority if self.subscribers else "background"

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
        self.readers_changed()

    def unsubscribe(self, subscriber: Subscriber) -> None:
        if subscriber in self.subscribers:
            self.subscribers.remove(subscriber)
            self.readers_changed()

    def readers_changed(self) -> None:
        """Tell the engine when the priority it holds is no longer the one the turn wants. One
        task at a time does the telling, so a detach and a quick re-attach arrive in order."""
        holds = self.told or self.request.priority
        if not (self.running and self.in_engine) or self.priority == holds:
            return
        if self.telling is None or self.telling.done():
            self.telling = asyncio.get_running_loop().create_task(tell_priority(self))


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


def _claim(conversation_id: int, user_id: int) -> None:
    with _turns_lock:
        if conversation_id in _turns:
            raise ChatRefused("busy", "this conversation is already answering in another window")
        cap = settings.MAX_SOCKETS_PER_USER
        if not chat_answers.take(f"user:{user_id}", cap):
            raise ChatRefused("too_many", f"you have {cap} answers running already; stop one "
                              "or wait for it to finish")  # fmt: skip
        _turns[conversation_id] = None


def register(turn: Turn) -> None:
    with _turns_lock:
        _turns[turn.conversation_id] = turn


def _release(conversation_id: int, user_id: int) -> None:
    with _turns_lock:
        if _turns.pop(conversation_id, False) is not False:
            chat_answers.give_back(f"user:{user_id}")


@dataclass(slots=True)
class Claim:
    """Holds a conversation's claim while a turn is prepared; released unless handed over."""

    user_id: int
    conversation_id: int | None = None

    def take(self, conversation_id: int) -> None:
        _claim(conversation_id, self.user_id)
        self.conversation_id = conversation_id

    def drop(self) -> None:
        if self.conversation_id is not None:
            _release(self.conversation_id, self.user_id)


# --- running a turn -------------------------------------------------------------------------------


def save_partial(message_id: int, content: str) -> None:
    Message.objects.filter(pk=message_id, state=Message.State.STREAMING).update(content=content)


def save_answer(turn: Turn, content: str, final: dict | None) -> dict:
    """Store the answer and its figures (its TTFT as the page saw it, when a socket showed
    it); returns the frame that ends the turn. `final` None: the stream broke without a final
    event."""
    final = final or {"type": "error", "message": "the inference worker stopped answering"}
    engine_figures = final.get("figures") or {}
    final = {**final, "figures": turn.first_output.figures(engine_figures,
                                                           turn.request.accepted_perf())}
    extra = {}
    output_tokens = engine_figures.get("output_tokens")
    if turn.prefix_tokens and output_tokens is not None:
        extra["answer_tokens"] = turn.prefix_tokens + output_tokens
    if turn.thinking_s is not None:
        extra["thinking_s"] = round(turn.thinking_s, 2)
    outcome, error, figures = record_answer(turn.request, final, source="chat",
                                            client=turn.username, extra=extra)  # fmt: skip
    if outcome == "error":
        state = Message.State.FAILED
    elif outcome == "cancelled":
        state, error = Message.State.STOPPED, turn.stop_reason or "stopped"
    else:
        state = Message.State.COMPLETE
    done = {"content": content, "state": state, "error": error, "figures": figures}
    if turn.splitter is not None:
        done["thinking"] = turn.thinking
    Message.objects.filter(pk=turn.message_id).update(**done)
    Conversation.objects.filter(pk=turn.conversation_id).update(updated_at=timezone.now())
    if state == Message.State.FAILED:
        return {"type": "error", "code": final.get("code") or "failed", "message": error,
                "message_id": turn.message_id, "figures": figures, "text": content,
                "thinking": turn.thinking}  # fmt: skip
    return {"type": "done", "finish_reason": outcome, "state": state, "error": error,
            "figures": figures, "message_id": turn.message_id, "text": content,
            "thinking": turn.thinking}  # fmt: skip


async def tell_priority(turn: Turn) -> None:
    """Set the request's priority in the engine (InferenceClient.set_priority) until it holds
    what the turn wants; the last change wins."""
    client = get_client()
    while turn.running and turn.priority != (turn.told or turn.request.priority):
        priority = turn.priority
        try:
            await client.set_priority(turn.request_id, priority)
        except Exception:  # noqa: BLE001 - the answer goes on at the priority it had
            log.warning("could not make chat turn %s %s", turn.request_id, priority, exc_info=True)
            return
        turn.told = priority


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
        async with aclosing(client.stream(turn.request, turn.spec)) as events:
            async for event in events:
                # A stop that came before the engine had the request (the model still loading)
                # found nothing to cancel: the first event means it is there now.
                if turn.stop_reason and not turn.cancel_sent_to_stream:
                    turn.cancel_sent_to_stream = True
                    await client.cancel(turn.request_id)
                kind = event.get("type")
                # Likewise a priority change: the loading announcement comes before the
                # engine has the request, every other event after.
                if not turn.in_engine and not (kind == "phase" and event.get("phase") == "loading"):
                    turn.in_engine = True
                    turn.readers_changed()
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
