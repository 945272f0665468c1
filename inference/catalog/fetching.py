"""Fetching a file over HTTP from the LAN or a registry, through the download guard: streamed
to a partial file and hashed as the bytes arrive, resumed with a Range request after a dropped
connection or a 5xx (exponential backoff), and refused at once unless the first bytes are the
GGUF magic. No database: a download job (inference.catalog.downloads), a pull
(inference.catalog.pulling) and a copy to a box (inference.serving.copy_worker) each pass their
own progress.

Every connection, the first and each redirect's, goes through inference.catalog.netguard: to an
address it checked (never loopback, link-local or the appliance's own Redis and database), and
the URL's credentials are used for the request but never shown on a job or logged.
"""

import hashlib
import logging
import os
import re
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit

import httpx

from inference.catalog import netguard
from inference.catalog.netguard import (
    AddressRefused,
    DownloadPolicy,
    RedactURLs,
    redact_text,
    redact_url,
)

# httpx logs each request's URL at INFO, and a download URL may carry a token: the appliance's
# only httpx requests are downloads, so its log records go out redacted.
logging.getLogger("httpx").addFilter(RedactURLs())

CHUNK_BYTES = 1 << 20
ATTEMPTS = 5
BACKOFF_S = 0.5  # doubled after each failed attempt
MAX_BACKOFF_S = 30.0
TIMEOUT_S = 30.0  # per network operation (connect, each read), not the whole download
MAX_URL_LENGTH = 2000
MAX_REDIRECTS = 5
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
GGUF_MAGIC = b"GGUF"
_CONTENT_RANGE = re.compile(r"^bytes\s+(?:(\d+)-(\d+)|\*)/(\d+|\*)$")


class DownloadError(Exception):
    """The download cannot succeed (bad status, not a GGUF file, no disk space)."""


class Interrupted(Exception):
    """The transfer stopped early in a way a retry can fix."""


# Named errors that are retried with backoff; everything else fails the job at once.
RETRIED = (httpx.TransportError, Interrupted)


def validate_url(url: str) -> str:
    """An http(s) URL with a host, or ValueError saying what is wrong."""
    url = url.strip()
    if len(url) > MAX_URL_LENGTH:
        raise ValueError(f"the URL is longer than {MAX_URL_LENGTH} characters")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError("only http:// and https:// URLs can be downloaded")
    if not parts.hostname:
        raise ValueError("the URL has no host")
    return url


class Progress(Protocol):
    """How a fetch reports (inference.jobs.progress.JobProgress, or a copy's own)."""

    def update(self, done: int, total: int | None, verb: str = "") -> None: ...
    def note(self, message: str) -> None: ...
    def check(self) -> None: ...


def fetch_with_retries(
    url: str,
    part: Path,
    progress: Progress,
    attempts: int,
    backoff: float,
    policy: DownloadPolicy,
    headers: dict[str, str] | None = None,
) -> str:
    for attempt in range(1, attempts + 1):
        try:
            return fetch(url, part, progress, policy, headers)
        except RETRIED as exc:
            if attempt == attempts:
                raise DownloadError(f"gave up after {attempts} attempts: {describe(exc)}") from exc
            delay = min(MAX_BACKOFF_S, backoff * 2 ** (attempt - 1))
            have = part.stat().st_size if part.exists() else 0
            progress.note(
                f"interrupted at {have} bytes ({describe(exc)}); resuming in {delay:.1f} s"
            )
            time.sleep(delay)
            progress.check()
    raise AssertionError("unreachable")


def describe(exc: Exception) -> str:
    """An error as a job or the log shows it: any URL in it redacted."""
    return redact_text(str(exc) or type(exc).__name__)


def fetch(
    url: str,
    part: Path,
    progress: Progress,
    policy: DownloadPolicy,
    headers: dict[str, str] | None = None,
) -> str:
    """One attempt: append to `part` from its current length; returns the sha256 of the whole
    file. Raises Interrupted / httpx.TransportError for what a retry can fix. `headers` go with
    the request (a copy's token: inference.serving.copy_worker)."""
    digest = hashlib.sha256()
    have = part.stat().st_size if part.exists() else 0
    if have:
        _hash_into(digest, part)  # the resumed file's hash covers the bytes already here
    headers = {**(headers or {}), **({"Range": f"bytes={have}-"} if have else {})}
    with guarded_get(url, headers, policy) as r:
        if r.status_code == 416 and have:
            _, _, total = _content_range(r.headers.get("content-range", ""))
            if total == have:
                return digest.hexdigest()  # the partial file was already complete
            part.unlink(missing_ok=True)
            raise Interrupted("the server refused the resume point; starting over")
        if r.status_code >= 500 or r.status_code == 429:
            raise Interrupted(f"the server answered HTTP {r.status_code}")
        if r.status_code not in (200, 206):
            raise DownloadError(f"the server answered HTTP {r.status_code}")
        if r.status_code == 206:
            start, _, total = _content_range(r.headers.get("content-range", ""))
            if start != have:
                part.unlink(missing_ok=True)
                raise Interrupted(f"the server resumed at byte {start}, not {have}; starting over")
            mode = "ab"
        else:  # a full answer: the server ignored Range, or this is the first try
            length = r.headers.get("content-length")
            total = int(length) if length and length.isdigit() else None
            have, mode, digest = 0, "wb", hashlib.sha256()
        if total is not None:
            _check_disk(part.parent, total - have)
        with open(part, mode) as f:
            head = None if have else b""  # only a download from byte 0 sees the magic
            # As the bytes arrive: a fixed chunk size would buffer, and lose, up to a chunk
            # when the connection drops.
            for chunk in r.iter_bytes():
                if head is not None:  # the first bytes of the file decide if it is a GGUF
                    head += chunk[: len(GGUF_MAGIC) - len(head)]
                    if len(head) >= len(GGUF_MAGIC):
                        if head != GGUF_MAGIC:
                            raise DownloadError("the URL does not serve a GGUF file")
                        head = None
                f.write(chunk)
                digest.update(chunk)
                have += len(chunk)
                progress.update(have, total, "downloaded")
            f.flush()
            os.fsync(f.fileno())
    if total is not None and have != total:
        raise Interrupted(f"the connection closed after {have} of {total} bytes")
    return digest.hexdigest()


@contextmanager
def guarded_get(
    url: str, headers: dict[str, str], policy: DownloadPolicy
) -> Iterator[httpx.Response]:
    """The streamed answer to GET `url`, following redirects by hand: httpx's own following
    would connect to each new host unchecked."""
    redirected_from = None
    for _ in range(MAX_REDIRECTS + 1):
        # A client per hop: a pooled connection, keyed by address, could carry one host's TLS
        # session to another host's request. trust_env=False: a proxy from the environment
        # would make the connection, not to the address checked.
        with httpx.Client(timeout=httpx.Timeout(TIMEOUT_S), trust_env=False) as client:
            try:
                request = _pinned_request(client, url, headers, policy)
            except AddressRefused as exc:
                if redirected_from is None:
                    raise
                raise AddressRefused(f"{redirected_from} redirected the download to "
                                     f"{redact_url(url)}, but {exc}") from exc  # fmt: skip
            response = client.send(request, stream=True)
            try:
                location = response.headers.get("location")
                if response.status_code not in REDIRECT_STATUSES or location is None:
                    yield response
                    return
            finally:
                response.close()
        redirected_from = f"the server at {redact_url(url)}"
        url = _redirect_target(url, location)
    raise DownloadError(f"the server redirected the download more than {MAX_REDIRECTS} times")


def _redirect_target(url: str, location: str) -> str:
    target = str(httpx.URL(url).join(location))
    try:
        return validate_url(target)
    except ValueError as exc:
        raise DownloadError(f"the server at {redact_url(url)} redirected the download to "
                            f"{redact_url(target)}: {exc}") from exc  # fmt: skip


def _pinned_request(
    client: httpx.Client, url: str, headers: dict[str, str], policy: DownloadPolicy
) -> httpx.Request:
    """GET `url`, addressed to the IP address the guard checked rather than to the name: the
    name is resolved once, here, so it cannot resolve elsewhere between the check and the
    connect. The server still sees its name in Host and, over https, in SNI and the
    certificate check (httpcore's sni_hostname)."""
    target = httpx.URL(url)
    host = target.raw_host.decode("ascii")
    port = target.port or (443 if target.scheme == "https" else 80)
    try:
        address = netguard.resolve(host, port, policy)
    except socket.gaierror as exc:  # a retry may find it: the name server may be back
        raise Interrupted(f"the host {host} was not found ({exc.strerror})") from exc
    extensions = {"sni_hostname": host} if target.scheme == "https" else {}
    return client.build_request(
        "GET", target.copy_with(host=str(address)),
        headers={**headers, "Host": target.netloc.decode("ascii")}, extensions=extensions,
    )  # fmt: skip


def _content_range(value: str) -> tuple[int | None, int | None, int | None]:
    match = _CONTENT_RANGE.match(value.strip())
    if not match:
        raise DownloadError(f"the server sent an unreadable Content-Range: {value!r}")
    start, end, total = match.groups()
    as_int = lambda v: int(v) if v and v != "*" else None  # noqa: E731
    return as_int(start), as_int(end), as_int(total)


def _hash_into(digest, path: Path) -> None:
    with open(path, "rb") as f:
        while chunk := f.read(4 * CHUNK_BYTES):
            digest.update(chunk)


def _check_disk(directory: Path, needed: int) -> None:
    free = shutil.disk_usage(directory).free
    if needed > free:
        raise DownloadError(
            f"not enough disk space: the file needs {needed / (1 << 20):.0f} MiB more, "
            f"{free / (1 << 20):.0f} MiB is free"
        )
