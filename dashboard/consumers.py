"""WebSocket consumers: the chat (/ws/chat/) and the live dashboard (/ws/telemetry/).

Both check the user in connect(); the chat checks again on every turn (dashboard.chat), since a
socket outlives a logout. Origins are checked in asgi.py (AllowedHostsOriginValidator).

Chat frames in:
    {"type": "send", "conversation": id | null, "content": str,
     "model": str?, "system_prompt": str?, "images": [id]?}  (images: attachments uploaded to
     POST /chat/images/, in order; with images the content may be empty)
    {"type": "edit", "conversation": id, "message": id, "content": str, "images": [id]?}
     (a question, resent; without images it keeps the question's)
    {"type": "regenerate", "conversation": id}
    {"type": "continue", "conversation": id}  (the last answer writes on)
    {"type": "attach", "conversation": id}  (watch its running answer, after a reload)
    {"type": "switch", "conversation": id, "message": id}  (show another version of a turn)
    {"type": "rename", "conversation": id, "title": str}
    {"type": "stop"}
    {"type": "count", "seq": int, "conversation": id | null, "content": str, "model": str?,
     "system_prompt": str?}  (the composer's token counter: what a send would read now)
Chat frames out:
    {"type": "conversation", "id", "title", "model", "kind", "attached", "message_id",
     "user_message_id", "replaced_message_id", "truncate_from", "left_out", "context_start",
     "request_id"}
    {"type": "snapshot", "message_id", "text", "thinking", "status"}  (after attaching: the
     answer so far)
    {"type": "phase", "phase": "loading" | "waiting" | "prefilling" | "decoding"}
    {"type": "progress", "phase": "waiting", "ahead"}
    {"type": "progress", "phase": "prefilling", "done", "total", "cached"}
    {"type": "thinking", "text": str}  (a thinking model's <think> block, apart from the answer)
    {"type": "token", "text": str}
    {"type": "done", "finish_reason": "stop" | "length" | "cancelled", "state", "error",
     "figures": {...}, "message_id", "text", "thinking"}
    {"type": "error", "message": str, "code": str, "message_id"?: id, "figures"?: {...}}
    {"type": "attached", "id", "running": false, "messages", "context_start"}  (nothing runs:
     the branch as saved)
    {"type": "branch", "id", "messages": [...], "context_start"}  (after a switch)
    {"type": "renamed", "id", "title"}
    {"type": "count", "seq", "tokens": int | null, "context", "left_out"}  (tokens null: not
     counted, the model is not loaded: dashboard.chat.counting)
A refused frame gets an error frame without message_id and changes nothing. An answer keeps
running when its socket closes; a new socket attaches to it (dashboard.chat.running).
"""

import asyncio
import contextlib
import json
import logging
import math
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from channels.layers import get_channel_layer
from django.conf import settings
from redis import RedisError

from appliance.arrival import arrival
from dashboard.chat import counting, running, turns
from dashboard.limits import chat_sockets
from dashboard.web import telemetry
from dashboard.web.boxes import box_for
from dashboard.web.panels import panels, shares_in
from dashboard.web.share_names import share_names_async
from inference.engine.generation import MAX_IMAGES
from inference.serving.feed import TELEMETRY_GROUP

log = logging.getLogger(__name__)

MAX_FRAME_CHARS = 1024 * 1024  # content is capped at 100k characters; JSON escapes can grow it
OUTPUT_FRAMES = frozenset({"token", "thinking"})  # what the model wrote: the first one is its TTFT
CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_TOO_MANY = 4429
RELAY_RETRY_S = 1.0  # a dashboard socket's wait before joining its group again after a loss


def _finite(value: Any) -> Any:
    """JSON for browsers: NaN and infinities (a histogram's last bucket) become null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


class _JsonConsumer(AsyncJsonWebsocketConsumer):
    @classmethod
    async def encode_json(cls, content) -> str:
        return json.dumps(_finite(content), allow_nan=False)

    async def send_error(self, code: str, message: str, **extra) -> None:
        await self.send_json({"type": "error", "code": code, "message": message, **extra})


class ChatConsumer(_JsonConsumer):
    """One browser tab. Turn frames go through an outbox that one task drains in order, so a
    turn never waits for a slow socket, and an attach's replay cannot interleave with live
    frames. The first output frame that a socket has sent stamps its turn's TTFT
    (dashboard.wire)."""

    # No channel of its own on the channel layer: answers reach the socket in this process
    # (dashboard.chat.running), and a channel nobody sends to would only tie the socket to the
    # broker (Channels closes a consumer whose channel receive fails, as when Redis restarts).
    channel_layer_alias = None
    turn: running.Turn | None = None  # the answer this socket watches (its own or attached)
    subscriber: running.Subscriber | None = None  # how this socket watches it
    outbox: asyncio.Queue | None = None  # (frame, the turn it belongs to or None)
    sender: asyncio.Task | None = None
    holder: str | None = None  # "user:<id>" while this socket counts against its user's cap
    counter: asyncio.Task | None = None  # counting the composer's tokens
    count_wanted: counting.CountAsk | None = None  # the latest ask it has not started

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        await self.accept()
        holder = f"user:{user.pk}"
        cap = settings.MAX_SOCKETS_PER_USER
        if not chat_sockets.take(holder, cap):
            # Accepted first, so the page can show why: one person's windows must not fill
            # the engine's queue for the household.
            await self.send_error("too_many", f"you have {cap} chats open already; close one "
                                  "of them to chat here")  # fmt: skip
            await self.close(code=CLOSE_TOO_MANY)
            return
        self.holder = holder
        self.outbox = asyncio.Queue()
        self.sender = asyncio.create_task(self._drain_outbox())

    async def _drain_outbox(self) -> None:
        while True:
            frame, turn = await self.outbox.get()
            try:
                await self.send_json(frame)
            except Exception:  # noqa: BLE001 - the socket went away; the turn goes on
                return
            if turn is not None and frame.get("type") in OUTPUT_FRAMES:
                turn.first_output.sent()  # written to the transport now

    def post(self, frame: dict, turn: running.Turn | None = None) -> None:
        """A frame for this socket (never blocks); `turn`: the answer it is part of."""
        self.outbox.put_nowait((frame, turn))

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        with arrival():  # a turn's clock starts now, as an HTTP request's at the gate
            await self._receive(text_data)

    async def _receive(self, text_data: str | None) -> None:
        if text_data is None:
            await self.send_error("invalid", "frames must be JSON text")
            return
        if len(text_data) > MAX_FRAME_CHARS:
            await self.send_error("too_long", f"a frame is at most {MAX_FRAME_CHARS} characters")
            return
        try:
            frame = json.loads(text_data)
        except ValueError:
            await self.send_error("invalid", "the frame is not JSON")
            return
        await self.receive_json(frame)

    async def receive_json(self, frame, **kwargs) -> None:
        if not isinstance(frame, dict):
            await self.send_error("invalid", "a frame must be a JSON object")
            return
        handler = {
            "send": self.on_send, "edit": self.on_edit, "regenerate": self.on_regenerate,
            "continue": self.on_continue, "attach": self.on_attach, "switch": self.on_switch,
            "rename": self.on_rename, "stop": self.on_stop, "count": self.on_count,
        }  # fmt: skip
        kind = frame.get("type")
        if not isinstance(kind, str) or kind not in handler or self.outbox is None:
            await self.send_error("invalid", "type must be one of: " + ", ".join(handler))
            return
        try:
            await handler[kind](frame)
        except turns.ChatRefused as exc:
            await self.send_error(exc.code, exc.message)
        except Exception:  # noqa: BLE001 - a bug or a database outage: say so, keep the socket
            log.exception("chat frame %r failed", kind)
            await self.send_error("internal", "the appliance failed to handle this; see its log")

    def _who(self) -> tuple[int, Any]:
        return self.scope["user"].pk, self.scope.get("session")

    # --- frames --------------------------------------------------------------------------------

    async def on_send(self, frame: dict) -> None:
        conversation = _conversation_id(frame.get("conversation"), required=False)
        images = _image_ids(frame)
        content = _content(frame, pictures=bool(images))
        model = _optional_str(frame, "model", turns.MAX_MODEL_NAME_CHARS)
        system_prompt = _optional_str(frame, "system_prompt", turns.MAX_SYSTEM_PROMPT_CHARS)
        self._check_idle()
        turn = await _preparing(turns.prepare_send)(
            *self._who(), conversation_id=conversation, content=content, model_name=model,
            system_prompt=system_prompt, image_ids=images or [],
        )  # fmt: skip
        self._start(turn)

    async def on_edit(self, frame: dict) -> None:
        conversation = _conversation_id(frame.get("conversation"), required=True)
        message = _conversation_id(frame.get("message"), required=True, what="message")
        images = _image_ids(frame)
        content = _content(frame, pictures=bool(images))
        self._check_idle()
        turn = await _preparing(turns.prepare_edit)(
            *self._who(), conversation_id=conversation, message_id=message, content=content,
            image_ids=images,
        )  # fmt: skip
        self._start(turn)

    async def on_regenerate(self, frame: dict) -> None:
        conversation = _conversation_id(frame.get("conversation"), required=True)
        self._check_idle()
        prepare = _preparing(turns.prepare_regenerate)
        turn = await prepare(*self._who(), conversation_id=conversation)
        self._start(turn)

    async def on_continue(self, frame: dict) -> None:
        conversation = _conversation_id(frame.get("conversation"), required=True)
        self._check_idle()
        turn = await _preparing(turns.prepare_continue)(*self._who(), conversation_id=conversation)
        self._start(turn)

    async def on_attach(self, frame: dict) -> None:
        conversation = _conversation_id(frame.get("conversation"), required=True)
        self._check_idle()
        saved = await database_sync_to_async(turns.check_attach)(
            *self._who(), conversation_id=conversation
        )
        turn = running.running_turn(conversation)
        if turn is None or not turn.running or turn.user_id != self.scope["user"].pk:
            self.post({"type": "attached", "id": conversation, "running": False, **saved})
            return
        self._watch(turn, replay=True)

    async def on_switch(self, frame: dict) -> None:
        conversation = _conversation_id(frame.get("conversation"), required=True)
        message = _conversation_id(frame.get("message"), required=True, what="message")
        self._check_idle()
        reply = await database_sync_to_async(turns.switch_version)(
            *self._who(), conversation_id=conversation, message_id=message
        )
        self.post(reply)

    async def on_rename(self, frame: dict) -> None:
        conversation = _conversation_id(frame.get("conversation"), required=True)
        title = _optional_str(frame, "title", turns.MAX_TITLE_CHARS)
        if not title or not title.strip():
            raise turns.ChatRefused("invalid", "title must be a non-empty string")
        reply = await database_sync_to_async(turns.rename)(
            *self._who(), conversation_id=conversation, title=title
        )
        self.post(reply)

    async def on_stop(self, frame: dict) -> None:
        # Idempotent: a stop racing the answer's end is not an error.
        if self.turn is not None and self.turn.running:
            await running.cancel(self.turn, "stopped by the user")

    async def on_count(self, frame: dict) -> None:
        seq = frame.get("seq")
        if isinstance(seq, bool) or not isinstance(seq, int):
            raise turns.ChatRefused("invalid", "seq must be an integer")
        content = frame.get("content")
        if not isinstance(content, str):
            raise turns.ChatRefused("invalid", "content must be a string")
        if len(content) > turns.MAX_CONTENT_CHARS:
            raise turns.ChatRefused("too_long", f"a message may be at most "
                                    f"{turns.MAX_CONTENT_CHARS:,} characters")  # fmt: skip
        self.count_wanted = counting.CountAsk(
            seq, _conversation_id(frame.get("conversation"), required=False), content,
            _optional_str(frame, "model", turns.MAX_MODEL_NAME_CHARS),
            _optional_str(frame, "system_prompt", turns.MAX_SYSTEM_PROMPT_CHARS),
        )  # fmt: skip
        if self.counter is None or self.counter.done():
            self.counter = asyncio.create_task(self._count_latest())

    async def _count_latest(self) -> None:
        """One count at a time per socket, of the latest ask: a page counting as someone types
        costs one render and one tokenize at a time, never a queue of them."""
        while self.count_wanted is not None:
            ask, self.count_wanted = self.count_wanted, None
            try:
                reply = await counting.count(*self._who(), ask)
            except Exception:  # noqa: BLE001 - a bug or a database outage: no count, say so
                log.exception("counting the composer's tokens failed")
                reply = counting.uncounted(ask.seq)
            self.post(reply)

    # --- the watched turn ----------------------------------------------------------------------

    def _check_idle(self) -> None:
        if self.turn is not None and self.turn.running:
            raise turns.ChatRefused("busy", "an answer is still streaming; stop it first")

    def _watch(self, turn: running.Turn, *, replay: bool) -> None:
        self._unwatch()
        self.turn = turn
        self.subscriber = lambda frame: self.post(frame, turn)
        turn.subscribe(self.subscriber, replay=replay)

    def _unwatch(self) -> None:
        if self.turn is not None:
            self.turn.unsubscribe(self.subscriber)
            self.turn = self.subscriber = None

    def _start(self, turn: running.Turn) -> None:
        self.post(turn.announcement())
        self._watch(turn, replay=False)
        running.start(turn)

    async def disconnect(self, code) -> None:
        # The answer runs on to its end (and is saved); a new socket can attach to it.
        self._unwatch()
        for task in (self.sender, self.counter):
            if task is not None:
                task.cancel()
        self.sender = self.counter = None
        if self.holder is not None:
            chat_sockets.give_back(self.holder)
            self.holder = None


def _preparing(prepare):
    """A turn's preparation (database work and the prompt's render, which may wait up to the
    render pool's 5 s cap on a hostile template) on a thread of its own: on the one thread that
    database_sync_to_async shares by default, it would hold up every other person's send."""
    return database_sync_to_async(prepare, thread_sensitive=False)


def _conversation_id(value, *, required: bool, what: str = "conversation") -> int | None:
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise turns.ChatRefused("invalid", f"{what} must be a {what} id")
    return value


def _image_ids(frame: dict) -> list[int] | None:
    """A frame's images: ids of pictures uploaded to POST /chat/images/, in order; None when
    the frame has none."""
    ids = frame.get("images")
    if ids is None:
        return None
    if not isinstance(ids, list) or any(isinstance(i, bool) or not isinstance(i, int) or i <= 0
                                        for i in ids):  # fmt: skip
        raise turns.ChatRefused("invalid", "images must be a list of image ids")
    if len(ids) > MAX_IMAGES:
        raise turns.ChatRefused("too_many", f"a message may have at most {MAX_IMAGES} images; "
                                f"this one has {len(ids)}")  # fmt: skip
    if len(set(ids)) != len(ids):
        raise turns.ChatRefused("invalid", "an image is named twice")
    return ids


def _content(frame: dict, *, pictures: bool = False) -> str:
    """The frame's text: not empty, unless the message is pictures alone."""
    content = frame.get("content")
    if not isinstance(content, str) or not (content.strip() or pictures):
        raise turns.ChatRefused("invalid", "content must be a non-empty string")
    if len(content) > turns.MAX_CONTENT_CHARS:
        # Refused whole, never cut: the page says so before sending, too.
        raise turns.ChatRefused(
            "too_long", f"a message may be at most {turns.MAX_CONTENT_CHARS:,} characters; this "
            f"one has {len(content):,}",
        )  # fmt: skip
    return content


def _optional_str(frame: dict, key: str, limit: int) -> str | None:
    value = frame.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise turns.ChatRefused("invalid", f"{key} must be a string")
    if len(value) > limit:
        raise turns.ChatRefused("too_long", f"{key} may be at most {limit} characters")
    return value


class TelemetryConsumer(_JsonConsumer):
    """Relays group "telemetry" to staff dashboards as {"type": "snapshot", "panels": {...}},
    with the names of the apps and people the engines name only by id (panels["apps"]) and the
    worker's box (panels["box"]: dashboard.web.boxes).

    The group is received by a relay task of the socket's own rather than by Channels' loop,
    which closes the socket on the first broker error: the relay waits and joins the group
    again (a restarted Redis has forgotten its groups), so an open dashboard lives on across
    a broker restart."""

    channel_layer_alias = None  # the relay has the channel
    relay: asyncio.Task | None = None

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        if not user.is_staff:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        layer = get_channel_layer()
        channel = await layer.new_channel()
        await layer.group_add(TELEMETRY_GROUP, channel)  # a broker that is out refuses the socket
        await self.accept()
        self.relay = asyncio.create_task(self._relay(layer, channel))
        telemetry.subscribe()

    async def disconnect(self, code) -> None:
        if self.relay is not None:
            relay, self.relay = self.relay, None
            relay.cancel()
            await asyncio.gather(relay, return_exceptions=True)  # it leaves the group
            telemetry.unsubscribe()

    async def _relay(self, layer, channel: str) -> None:
        joined = True
        try:
            while True:
                try:
                    if not joined:
                        await layer.group_add(TELEMETRY_GROUP, channel)
                        joined = True
                    await self.dispatch(await layer.receive(channel))
                except (RedisError, OSError) as exc:
                    if joined:
                        log.warning("dashboard socket lost the broker (%s); joining again", exc)
                    joined = False
                    await asyncio.sleep(RELAY_RETRY_S)
        finally:
            with contextlib.suppress(Exception):  # best effort: the group entry expires anyway
                await asyncio.wait_for(layer.group_discard(TELEMETRY_GROUP, channel), 5)

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        await self.send_error("invalid", "this socket only sends")

    async def telemetry_snapshot(self, message: dict) -> None:
        snapshot = message.get("snapshot")
        if not isinstance(snapshot, dict):
            return
        result = panels(snapshot)
        result["apps"] = await share_names_async(shares_in(result))
        try:
            result["box"] = await database_sync_to_async(box_for)(result)
        except Exception as exc:  # noqa: BLE001 - Redis or the database out: the rest still shows
            log.warning("the boxes panel could not be read: %s", exc)
        await self.send_json({"type": "snapshot", "panels": result})
