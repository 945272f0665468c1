"""WebSocket consumers: the chat (/ws/chat/) and the live dashboard (/ws/telemetry/).

Both check the user in connect(); the chat checks again on every turn (dashboard.chat), since a
socket outlives a logout. Origins are checked in asgi.py (AllowedHostsOriginValidator).

Chat frames in:
    {"type": "send", "conversation": id | null, "content": str,
     "model": str?, "system_prompt": str?}
    {"type": "stop"}
    {"type": "regenerate", "conversation": id}
Chat frames out:
    {"type": "conversation", "id", "title", "model", "message_id", "user_message_id",
     "replaced_message_id", "request_id"}
    {"type": "phase", "phase": "waiting" | "prefilling" | "decoding"}
    {"type": "token", "text": str}
    {"type": "done", "finish_reason": "stop" | "length" | "cancelled", "state", "error",
     "figures": {...}, "message_id"}
    {"type": "error", "message": str, "code": str, "message_id"?: id, "figures"?: {...}}
A refused frame gets an error frame without message_id and changes nothing.
"""

import asyncio
import json
import logging
import math
from typing import Any

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from dashboard import chat
from dashboard.limits import chat_sockets
from dashboard.web import telemetry
from dashboard.web.panels import panels

log = logging.getLogger(__name__)

MAX_FRAME_CHARS = 256 * 1024  # content is capped at 32k characters; JSON escapes can grow it
DISCONNECT_GRACE_S = 5.0  # waiting for a cancelled turn to save; within the server's shutdown grace
CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_TOO_MANY = 4429


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
    turn: chat.Turn | None = None
    task: asyncio.Task | None = None
    closed = False
    holder: str | None = None  # "user:<id>" while this socket counts against its user's cap

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        await self.accept()
        holder = f"user:{user.pk}"
        cap = settings.MAX_SOCKETS_PER_USER
        if not chat_sockets.take(holder, cap):
            # Accepted first, so the page can show why: each socket runs one answer at a time,
            # and one person's windows must not fill the engine's queue for the household.
            await self.send_error("too_many", f"you have {cap} chats open already; close one "
                                  "of them to chat here")  # fmt: skip
            await self.close(code=CLOSE_TOO_MANY)
            return
        self.holder = holder

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
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
        handler = {"send": self.on_send, "stop": self.on_stop, "regenerate": self.on_regenerate}
        kind = frame.get("type")
        if not isinstance(kind, str) or kind not in handler:
            await self.send_error("invalid", "type must be one of: send, stop, regenerate")
            return
        try:
            await handler[kind](frame)
        except chat.ChatRefused as exc:
            await self.send_error(exc.code, exc.message)
        except Exception:  # noqa: BLE001 - a bug or a database outage: say so, keep the socket
            log.exception("chat frame %r failed", kind)
            await self.send_error("internal", "the appliance failed to handle this; see its log")

    # --- frames --------------------------------------------------------------------------------

    async def on_send(self, frame: dict) -> None:
        conversation = _conversation_id(frame.get("conversation"), required=False)
        content = frame.get("content")
        if not isinstance(content, str) or not content.strip():
            raise chat.ChatRefused("invalid", "content must be a non-empty string")
        if len(content) > chat.MAX_CONTENT_CHARS:
            raise chat.ChatRefused(
                "too_long", f"a message may be at most {chat.MAX_CONTENT_CHARS} characters"
            )
        model = _optional_str(frame, "model", chat.MAX_MODEL_NAME_CHARS)
        system_prompt = _optional_str(frame, "system_prompt", chat.MAX_SYSTEM_PROMPT_CHARS)
        self._check_idle()
        turn = await _preparing(chat.prepare_send)(
            self.scope["user"].pk, self.scope.get("session"), conversation_id=conversation,
            content=content, model_name=model, system_prompt=system_prompt,
        )  # fmt: skip
        await self._start(turn)

    async def on_regenerate(self, frame: dict) -> None:
        conversation = _conversation_id(frame.get("conversation"), required=True)
        self._check_idle()
        turn = await _preparing(chat.prepare_regenerate)(
            self.scope["user"].pk, self.scope.get("session"), conversation_id=conversation
        )
        await self._start(turn)

    async def on_stop(self, frame: dict) -> None:
        # Idempotent: a stop racing the answer's end is not an error.
        if self.turn is not None and self.task is not None and not self.task.done():
            await chat.cancel(self.turn, "stopped by the user")

    # --- the running turn --------------------------------------------------------------------

    def _check_idle(self) -> None:
        if self.task is not None and not self.task.done():
            raise chat.ChatRefused("busy", "an answer is still streaming; stop it first")

    async def _start(self, turn: chat.Turn) -> None:
        self.turn = turn
        await self.send_json(turn.announcement())
        # A task, so that this consumer keeps reading frames (a stop) while the answer streams.
        self.task = asyncio.create_task(chat.run_turn(turn, self._emit), name=turn.request_id)

    async def _emit(self, frame: dict) -> None:
        if self.closed:
            return
        try:
            await self.send_json(frame)
        except Exception:  # noqa: BLE001 - the socket went away mid-answer; the turn goes on
            self.closed = True

    async def disconnect(self, code) -> None:
        self.closed = True
        try:
            await self._end_turn()
        finally:
            if self.holder is not None:
                chat_sockets.give_back(self.holder)
                self.holder = None

    async def _end_turn(self) -> None:
        task, turn = self.task, self.turn
        if task is None or task.done() or turn is None:
            return
        await chat.cancel(turn, "the browser disconnected")
        # Wait for the cancelled turn to save what it generated; past the grace, cut it off.
        done, _ = await asyncio.wait({task}, timeout=DISCONNECT_GRACE_S)
        if not done:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)


def _preparing(prepare):
    """A turn's preparation (database work and the prompt's render, which may wait up to the
    render pool's 5 s cap on a hostile template) on a thread of its own: on the one thread that
    database_sync_to_async shares by default, it would hold up every other person's send."""
    return database_sync_to_async(prepare, thread_sensitive=False)


def _conversation_id(value, *, required: bool) -> int | None:
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise chat.ChatRefused("invalid", "conversation must be a conversation id")
    return value


def _optional_str(frame: dict, key: str, limit: int) -> str | None:
    value = frame.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise chat.ChatRefused("invalid", f"{key} must be a string")
    if len(value) > limit:
        raise chat.ChatRefused("too_long", f"{key} may be at most {limit} characters")
    return value


class TelemetryConsumer(_JsonConsumer):
    """Relays group "telemetry" to staff dashboards as {"type": "snapshot", "panels": {...}}."""

    joined = False

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated or not user.is_active:
            await self.close(code=CLOSE_UNAUTHORIZED)
            return
        if not user.is_staff:
            await self.close(code=CLOSE_FORBIDDEN)
            return
        await self.channel_layer.group_add(telemetry.GROUP, self.channel_name)
        self.joined = True
        await self.accept()
        telemetry.subscribe()

    async def disconnect(self, code) -> None:
        if self.joined:
            self.joined = False
            telemetry.unsubscribe()
            await self.channel_layer.group_discard(telemetry.GROUP, self.channel_name)

    async def receive(self, text_data=None, bytes_data=None, **kwargs) -> None:
        await self.send_error("invalid", "this socket only sends")

    async def telemetry_snapshot(self, message: dict) -> None:
        snapshot = message.get("snapshot")
        if not isinstance(snapshot, dict):
            return
        await self.send_json({"type": "snapshot", "panels": panels(snapshot)})
