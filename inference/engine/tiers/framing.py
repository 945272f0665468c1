"""The frame both kinds of warm-memory file share (tiers.files' kept prompts, tiers.images'
encoded images):

    magic (4 bytes)  u16 format  u16 0  u32 header length  header (JSON)  u32 crc32 of the header
    payload

A file is written under a temporary name and renamed, so a reader never sees half of one, and
only the appliance's own user may read it: a kept prompt is conversation text, an image's
embeddings are what a picture showed. Each reader checks what its own header says beyond this
frame (tiers.files.read_header, tiers.images.read).
"""

import json
import os
import struct
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

PREFIX = struct.Struct("<4sHHI")  # magic, format, reserved, header length
CRC = struct.Struct("<I")


def framed_size(header: bytes, n_payload: int) -> int:
    """The bytes a file of this header and payload size takes."""
    return PREFIX.size + len(header) + CRC.size + n_payload


def frame(magic: bytes, version: int, header: bytes) -> bytes:
    """What comes before the payload."""
    return PREFIX.pack(magic, version, 0, len(header)) + header + CRC.pack(zlib.crc32(header))


def write(final: Path, temporary_suffix: str, magic: bytes, version: int, header: bytes,
          *payloads: bytes) -> int:  # fmt: skip
    """Write a framed file under `final`'s temporary name, then rename it; returns the bytes
    written. Raises OSError (a full disk: the temporary file is removed, nothing is left)."""
    temporary = final.with_suffix(temporary_suffix)
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "wb") as out:
            out.write(frame(magic, version, header))
            for payload in payloads:
                out.write(payload)
        os.replace(temporary, final)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return framed_size(header, sum(len(payload) for payload in payloads))


def read_header(source: BinaryIO, magic: bytes, version: int, max_header: int, *,
                what: str, bad: type[ValueError]) -> tuple[dict, int]:  # fmt: skip
    """The checked JSON header of a framed file open at its start, and its length; raises `bad`
    (its message says what is wrong with `what`, e.g. "an entry") when the frame is not one."""
    prefix = source.read(PREFIX.size)
    if len(prefix) != PREFIX.size:
        raise bad("shorter than its header")
    found_magic, found_version, _, header_len = PREFIX.unpack(prefix)
    if found_magic != magic or found_version != version:
        raise bad(f"not {what} of this format")
    if header_len > max_header:
        raise bad("its header is too large")
    header = source.read(header_len)
    crc = source.read(CRC.size)
    if len(header) != header_len or len(crc) != CRC.size:
        raise bad("shorter than its header")
    if CRC.unpack(crc)[0] != zlib.crc32(header):
        raise bad("its header fails its checksum")
    fields = json.loads(header)
    if not isinstance(fields, dict):
        raise bad(f"its header is not {what}'s")
    return fields, header_len


def stored_files(directory: Path, suffixes: tuple[str, ...]) -> Iterator[tuple[int, int, Path]]:
    """(modification time, size, path) of a directory's files with these suffixes: what they
    take on the disk. A directory that is gone or another user's has none; files that vanish
    meanwhile are skipped."""
    try:
        paths = [p for p in Path(directory).iterdir() if p.suffix in suffixes]
    except OSError:
        return
    for path in paths:
        try:
            stat = path.stat()
        except OSError:
            continue
        yield stat.st_mtime_ns, stat.st_size, path
