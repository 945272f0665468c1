"""The body gate over real sockets: an anonymous POST that declares 50 MB and sends only its
headers gets its answer without sending the body; so does an anonymous 7 MB body (under the cap:
the key refuses it) to every route whose view declares a key, walked from the URL resolver.

Two servers in front of the same `appliance.asgi.application`:

- a minimal h11 server here that calls the application once the headers are in and streams the
  body to it: the gate's answer arrives with the body unsent;
- `manage.py serve` itself (uvicorn), in a subprocess, as a user runs it. (Daphne, which served
  the appliance before, read the whole body into a temporary file before it called the
  application: no answer came until the last declared byte had arrived.)
"""

import asyncio
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import h11
import pytest

from tests.appliance.routes import KeyedBody, keyed_body_routes
from tests.live import free_port

FIFTY_MB = 50 * 1024 * 1024
SEVEN_MB = 7 * 1024 * 1024  # under DATA_UPLOAD_MAX_MEMORY_SIZE: only the missing key refuses it
ROOT = Path(__file__).resolve().parents[2]
API_POST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % FIFTY_MB
)
UPLOAD_POST = (
    b"POST /models/upload/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    b"Content-Type: multipart/form-data; boundary=xyz\r\nContent-Length: %d\r\n\r\n" % (200 << 20)
)


async def _serve_h11(app, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """One request, h11-parsed; the application is called as soon as the headers are in."""
    conn = h11.Connection(h11.SERVER)

    async def next_event():
        while True:
            event = conn.next_event()
            if event is not h11.NEED_DATA:
                return event
            data = await reader.read(65536)
            conn.receive_data(data)
            if not data and conn.their_state is not h11.DONE:
                return None

    request = await next_event()
    assert isinstance(request, h11.Request)
    target = request.target.decode()
    path, _, query = target.partition("?")
    scope = {
        "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
        "method": request.method.decode(), "path": path, "raw_path": path.encode(),
        "root_path": "", "scheme": "http", "query_string": query.encode(),
        "headers": [(k.lower(), v) for k, v in request.headers],
        "client": ["127.0.0.1", 0], "server": ["127.0.0.1", 0],
    }  # fmt: skip
    done = False

    async def receive():
        nonlocal done
        if done:
            await asyncio.sleep(3600)
        event = await next_event()
        if isinstance(event, h11.Data):
            return {"type": "http.request", "body": bytes(event.data), "more_body": True}
        if isinstance(event, h11.EndOfMessage):
            done = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            writer.write(conn.send(h11.Response(status_code=message["status"],
                                                headers=message.get("headers", []))))  # fmt: skip
        elif message["type"] == "http.response.body":
            writer.write(conn.send(h11.Data(data=message.get("body", b""))))
            if not message.get("more_body"):
                writer.write(conn.send(h11.EndOfMessage()))
        await writer.drain()

    try:
        await app(scope, receive, send)
    finally:
        writer.close()


async def _status_after_headers_only(port: int, head: bytes, timeout: float) -> bytes | None:
    """Send the headers and the first bytes of the body; the status line if one comes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(head + b'{"mo')
        await writer.drain()
        try:
            return await asyncio.wait_for(reader.readline(), timeout)
        except TimeoutError:
            return None
    finally:
        writer.close()


@pytest.mark.asyncio
@pytest.mark.parametrize(("head", "status"), [(API_POST, b"401"), (UPLOAD_POST, b"302")])
async def test_a_streaming_server_answers_before_the_body(head, status):
    from appliance.asgi import application

    server = await asyncio.start_server(lambda r, w: _serve_h11(application, r, w), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        line = await _status_after_headers_only(port, head, timeout=10)
    assert line is not None and line.split()[1] == status, line


@pytest.fixture(scope="module")
def served_port(tmp_path_factory):
    """`manage.py serve` on a free port (no setup: the gate's refusals need no database)."""
    port = free_port()
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "LOG_LEVEL": "WARNING",
           "APPLIANCE_DATA_DIR": str(tmp_path_factory.mktemp("gate-serve"))}  # fmt: skip
    env.pop("REDIS_URL", None)
    process = subprocess.Popen(
        [sys.executable, "manage.py", "serve", "--skip-setup", "--port", str(port)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            pytest.fail(f"serve exited: {process.stderr.read().decode()[-2000:]}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.2)
    yield port
    process.terminate()
    process.wait(15)


def _answer_without_the_body(port: int, head: bytes) -> bytes:
    """Send the headers and a few bytes of a huge body; whatever comes back within 10 s."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head + b'{"mo')
        sock.settimeout(10)
        answer = b""
        while data := sock.recv(65536):  # the gate answers and closes the connection
            answer += data
        return answer


def test_the_served_appliance_refuses_an_anonymous_50_mb_post_before_its_body(served_port):
    answer = _answer_without_the_body(served_port, API_POST)
    assert answer.split(b"\r\n", 1)[0].split()[1] == b"401", answer
    assert b"missing_api_key" in answer or b"API key is required" in answer


def test_the_served_appliance_sends_an_anonymous_200_mb_upload_to_login_before_its_body(
    served_port,
):
    head = (
        b"POST /models/upload/ HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        b"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: %d\r\n\r\n"
        % (200 * 1024 * 1024)
    )
    answer = _answer_without_the_body(served_port, head)
    assert answer.split(b"\r\n", 1)[0].split()[1] == b"302", answer
    assert b"/login/" in answer


def _answer_to_headers_alone(port: int, head: bytes) -> bytes:
    """Send the headers and not one byte of the body; what comes back within 10 s (b"" when
    the server waits for the body instead)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head)
        sock.settimeout(10)
        answer = b""
        try:
            while data := sock.recv(65536):  # the gate answers and closes the connection
                answer += data
        except TimeoutError:
            pass
        return answer


@pytest.mark.parametrize("route", keyed_body_routes(), ids=str)
def test_every_keyed_route_refuses_an_anonymous_7_mb_body_before_a_byte_of_it(
    served_port, route: KeyedBody
):
    head = (
        f"{route.method} {route.path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Content-Type: application/json\r\nContent-Length: {SEVEN_MB}\r\n\r\n"
    ).encode()
    answer = _answer_to_headers_alone(served_port, head)
    assert answer, f"{route}: no answer until the body is sent"
    assert answer.split(b"\r\n", 1)[0].split()[1] == b"401", answer
    assert b"missing_api_key" in answer or b"API key is required" in answer
