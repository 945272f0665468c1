"""The two streamed wire formats: server-sent events (OpenAI, the Responses API, Anthropic) and
NDJSON lines (Ollama)."""

import json
from collections.abc import AsyncIterator

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
