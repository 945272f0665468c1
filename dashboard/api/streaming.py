"""The two streamed wire formats: server-sent events (OpenAI, the Responses API, Anthropic) and
NDJSON lines (Ollama)."""

import asyncio
import json
from collections.abc import AsyncGenerator, AsyncIterator

from django.http import StreamingHttpResponse

SSE_DONE = b"data: [DONE]\n\n"


def dumps(data: dict) -> str:
    return json.dumps(data, ensure_ascii=False, separators=(",", ":"))


def sse(data: dict) -> bytes:
    return f"data: {dumps(data)}\n\n".encode()


def sse_event(data: dict) -> bytes:
    """A server-sent event named by its `type` (the Responses API's and Anthropic's events)."""
    return f"event: {data['type']}\ndata: {dumps(data)}\n\n".encode()


def ndjson(data: dict) -> bytes:
    return (dumps(data) + "\n").encode()


def stream_response(chunks: AsyncIterator[bytes], content_type: str) -> StreamingHttpResponse:
    response = StreamingHttpResponse(chunks, content_type=content_type)
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # a reverse proxy must not hold tokens back
    return response


async def merged(streams: list[AsyncGenerator[bytes, None]]) -> AsyncIterator[bytes]:
    """The chunks of several streams in the order they come (an answer's choices side by side,
    each generating in its own sequence). However it ends, every stream is closed, so a client
    that left cancels them all."""
    queue: asyncio.Queue = asyncio.Queue()  # bounded by the answers' own lengths
    ended = object()

    async def pump(stream: AsyncGenerator[bytes, None]) -> None:
        try:
            async for chunk in stream:
                await queue.put(chunk)
        except Exception as exc:  # noqa: BLE001 - handed to the reader, who raises it
            await queue.put(exc)
        finally:
            await queue.put(ended)

    tasks = [asyncio.create_task(pump(stream)) for stream in streams]
    try:
        left = len(tasks)
        while left:
            item = await queue.get()
            if item is ended:
                left -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for stream in streams:
            await stream.aclose()
