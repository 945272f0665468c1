"""Helpers to drive the real ASGI application's WebSockets as a logged-in browser would."""

import asyncio

from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from appliance.asgi import application

ALLOWED_ORIGIN = "http://testserver"
FRAME_TIMEOUT = 120  # a first request loads the model; the 2-core box is shared


def _session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def session_cookie(user) -> str:
    return await database_sync_to_async(_session_cookie)(user)


async def open_socket(path: str, user=None, *, origin: str | None = ALLOWED_ORIGIN, cookie=None):
    """(communicator, connected, close code). `cookie` overrides the user's fresh session."""
    headers = []
    if origin is not None:
        headers.append((b"origin", origin.encode()))
    if cookie is None and user is not None:
        cookie = await session_cookie(user)
    if cookie is not None:
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await communicator.connect(timeout=10)
    return communicator, connected, code


async def until_final(communicator, *, on_token=None) -> list[dict]:
    """Every frame up to and including the turn's done or error frame."""
    frames = []
    while True:
        frame = await communicator.receive_json_from(timeout=FRAME_TIMEOUT)
        frames.append(frame)
        if frame["type"] == "token" and on_token is not None:
            await on_token(frame, frames)
        if frame["type"] in ("done", "error"):
            return frames


def streamed_text(frames: list[dict]) -> str:
    return "".join(f["text"] for f in frames if f["type"] == "token")


async def wait_for(predicate, timeout: float = 30.0, interval: float = 0.05) -> bool:
    """Poll an async predicate until it holds (a deadline, never a timing assertion)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while loop.time() < deadline:
        if await predicate():
            return True
        await asyncio.sleep(interval)
    return await predicate()
