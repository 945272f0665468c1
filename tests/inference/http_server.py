"""A real HTTP server on localhost that serves model files with Range support, and can misbehave
the ways a LAN server does: drop the connection part-way, ignore Range, trickle slowly, stall
until the test lets it go on, redirect elsewhere."""

import ipaddress
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

PIECE = 1024


class ModelServer:
    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.requests: list[tuple[str, str | None]] = []  # (path, Range header)
        self.headers: list[dict[str, str]] = []  # every request's headers, names in lower case
        self.redirects: dict[str, str] = {}  # path -> Location of a 302
        self.drop_after: int | None = None  # bytes sent before dropping the connection…
        self.drops_left = 0  # …on this many requests
        self.drop_prefix = ""  # …whose path starts with this
        self.delay = 0.0  # seconds between pieces
        self.pause_after: int | None = None  # bytes sent before waiting for `resume`
        self.resume = threading.Event()
        self.ignore_range = False
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> "ModelServer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    @property
    def port(self) -> int:
        return self._server.server_address[1]

    @property
    def endpoint(self) -> tuple[ipaddress.IPv4Address, int]:
        """What a download policy trusts to reach this server."""
        return ipaddress.ip_address("127.0.0.1"), self.port

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def _handler(self):
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                name = urlsplit(self.path).path.lstrip("/")
                asked = self.headers.get("Range")
                owner.requests.append((name, asked))
                owner.headers.append({k.lower(): v for k, v in self.headers.items()})
                if name in owner.redirects:
                    self.send_response(302)
                    self.send_header("Location", owner.redirects[name])
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                body = owner.files.get(name)
                if body is None:
                    self.send_error(404)
                    return
                start = 0
                match = re.fullmatch(r"bytes=(\d+)-", asked or "")
                if match and not owner.ignore_range:
                    start = int(match.group(1))
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.send_header("Content-Type", "application/octet-stream")
                self.end_headers()
                payload = body[start:]
                dropping = owner.drop_after is not None and name.startswith(owner.drop_prefix)
                if owner.drops_left > 0 and dropping:
                    owner.drops_left -= 1
                    self.wfile.write(payload[: owner.drop_after])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                try:
                    for offset in range(0, len(payload), PIECE):
                        if owner.pause_after is not None and offset == owner.pause_after:
                            self.wfile.flush()
                            owner.resume.wait(30)
                        self.wfile.write(payload[offset : offset + PIECE])
                        if owner.delay:
                            self.wfile.flush()
                            time.sleep(owner.delay)
                except (BrokenPipeError, ConnectionResetError):
                    self.close_connection = True  # the client went away (cancelled)

        return Handler
