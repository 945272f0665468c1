"""One kept prompt on disk, and the directory of a model's kept prompts.

An entry file:

    b"APKV"  u16 format  u16 0  u32 header length  header (JSON)  u32 crc32 of the header
    token ids (int32, little-endian)  payload (llama.cpp's sequence state)

(the frame is tiers.framing's, which tiers.images' files share)
The header names the layout (entries.KvLayout), the partition and conversation, the token
count and their crc32, the payload's length and crc32. `read_header` accepts a file only when
its header parses to an object, its checksum holds, its layout matches the expected one where
a restore depends on it (KvLayout.key), its size is exactly what the header says and its token
ids match their checksum; `read_payload` only when the payload matches its checksum. Anything
else raises BadEntry, and the caller deletes the file: it is never handed to llama.cpp. Files
are written under a temporary name and renamed (framing.write), so a runner killed mid-write
leaves a `.tmp` file (removed at the next open of any model: ledger), never a short entry under
a real name.

The directory of one model and layout is `<root>/<model key>/<layout digest>/`; a runner holds
an exclusive lock on it (`lock`) while it is loaded, so two runners never write one directory
and a page forgetting prompts never deletes files a runner is using: it records the forget
(tiers.forgets), and the runner holding the directory does it. Whoever only asks whether a
runner holds it (`is_locked`) takes a shared lock for that moment: a runner taking the
directory then waits out the probe instead of taking it for held.
"""

import errno
import fcntl
import json
import logging
import os
import shutil
import struct
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inference.engine.tiers import forgets, framing, images
from inference.engine.tiers.entries import KvEntry, KvLayout

log = logging.getLogger(__name__)

MAGIC = b"APKV"
FORMAT = 1
SUFFIX = ".kv"
TEMPORARY = ".tmp"
LOCK_NAME = ".lock"
TRASH = ".forgotten-"  # a layout directory being deleted whole
MAX_HEADER = 64 << 10  # partition and key are bounded (GenerationRequest), so this is ample
# A header's size with its layout, partition and conversation (each at most 256 characters,
# though JSON may escape them): what an entry's file takes beyond its token ids and state.
HEADER_ROOM = 4 << 10
_BUSY = (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES)
# How long a runner taking its directory waits out probes (each holds it for microseconds).
PROBE_WAIT_S = 1.0


class BadEntry(ValueError):
    """A file that is not an entry of this layout, is short, or fails a checksum."""


@dataclass(slots=True, frozen=True)
class EntryHeader:
    id: str
    partition: str | None
    cache_key: str | None
    tokens: np.ndarray
    payload_bytes: int
    payload_crc: int
    payload_offset: int


def entry_path(directory: Path, entry_id: str) -> Path:
    return directory / f"{entry_id}{SUFFIX}"


def _header(layout: KvLayout, entry: KvEntry, tokens_crc: int, n_payload: int,
            payload_crc: int) -> bytes:  # fmt: skip
    return json.dumps({
        "layout": layout.as_dict(),
        "id": entry.id,
        "partition": entry.partition,
        "cache_key": entry.cache_key,
        "n_tokens": entry.n_tokens,
        "tokens_crc": tokens_crc,
        "payload_bytes": n_payload,
        "payload_crc": payload_crc,
    }, sort_keys=True).encode()  # fmt: skip


def entry_size(layout: KvLayout, entry: KvEntry, n_payload: int) -> int:
    """The bytes `entry`'s file will take, at most (its checksums written at their widest),
    known before its state is read for checksums: what a write reserves (ledger.Ledger)."""
    widest = 0xFFFFFFFF
    header = _header(layout, entry, widest, n_payload, widest)
    return framing.framed_size(header, 4 * entry.n_tokens + n_payload)


def write_entry(directory: Path, layout: KvLayout, entry: KvEntry, data: bytes) -> int:
    """Write `entry` with its state `data`; returns the bytes written. Raises OSError (a full
    disk: the temporary file is removed and nothing is left behind)."""
    tokens = np.ascontiguousarray(entry.tokens, dtype="<i4").tobytes()
    header = _header(layout, entry, zlib.crc32(tokens), len(data), zlib.crc32(data))
    return framing.write(entry_path(directory, entry.id), TEMPORARY, MAGIC, FORMAT, header,
                         tokens, data)  # fmt: skip


def read_header(path: Path, layout: KvLayout) -> EntryHeader:
    """The header and token ids of an entry file, checked (module doc); raises BadEntry."""
    try:
        with open(path, "rb") as source:
            size = os.fstat(source.fileno()).st_size
            fields, header_len = framing.read_header(source, MAGIC, FORMAT, MAX_HEADER,
                                                     what="an entry", bad=BadEntry)  # fmt: skip
            saved = fields.get("layout")
            if not isinstance(saved, dict) or not layout.restores(saved):
                raise BadEntry("saved with another model file or other load settings")
            n_tokens, payload_bytes = _count(fields, "n_tokens"), _count(fields, "payload_bytes")
            offset = framing.framed_size(b"", header_len + 4 * n_tokens)
            if size != offset + payload_bytes:
                raise BadEntry(f"{size} bytes where its header says {offset + payload_bytes}")
            raw = source.read(4 * n_tokens)
            if len(raw) != 4 * n_tokens or zlib.crc32(raw) != fields.get("tokens_crc"):
                raise BadEntry("its token ids fail their checksum")
            return EntryHeader(
                id=_text(fields, "id", required=True), partition=_text(fields, "partition"),
                cache_key=_text(fields, "cache_key"),
                tokens=np.frombuffer(raw, dtype="<i4").astype(np.int32),
                payload_bytes=payload_bytes, payload_crc=_count(fields, "payload_crc"),
                payload_offset=offset,
            )  # fmt: skip
    except (OSError, ValueError, TypeError, KeyError) as exc:
        if isinstance(exc, BadEntry):
            raise
        if isinstance(exc, FileNotFoundError):
            raise BadEntry("it is gone") from None
        raise BadEntry(f"unreadable: {exc}") from None


def read_payload(path: Path, layout: KvLayout, entry: KvEntry) -> bytearray:
    """The entry's state, read whole and checked against the header's checksum and the entry
    as it was indexed; raises BadEntry (deleted, replaced, truncated or corrupted meanwhile)."""
    header = read_header(path, layout)
    if header.payload_bytes != entry.n_bytes or not np.array_equal(header.tokens, entry.tokens):
        raise BadEntry("it no longer holds what was indexed")
    data = bytearray(header.payload_bytes)
    try:
        with open(path, "rb") as source:
            source.seek(header.payload_offset)
            if source.readinto(data) != header.payload_bytes:
                raise BadEntry("its payload is short")
    except OSError as exc:
        raise BadEntry(f"unreadable: {exc}") from None
    if zlib.crc32(data) != header.payload_crc:
        raise BadEntry("its payload fails its checksum")
    return data


def lock(directory: Path):
    """An exclusive lock on a layout directory (the open file holds it), or None when another
    runner holds it. Probes (`is_locked`) hold a shared lock for a moment: while only they are
    there, this waits them out (up to PROBE_WAIT_S) rather than read them as a runner."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    handle = open(directory / LOCK_NAME, "a+b")  # noqa: SIM115 - held for the runner's life
    deadline = time.monotonic() + PROBE_WAIT_S
    try:
        while True:
            if _try_flock(handle, fcntl.LOCK_EX):
                return handle
            # A runner's exclusive lock excludes a shared one too; probes' shared ones do not.
            if not _try_flock(handle, fcntl.LOCK_SH) or time.monotonic() >= deadline:
                handle.close()
                return None
            fcntl.flock(handle, fcntl.LOCK_UN)
            time.sleep(0.001)
    except BaseException:
        handle.close()
        raise


def _try_flock(handle, kind: int) -> bool:
    try:
        fcntl.flock(handle, kind | fcntl.LOCK_NB)
    except OSError as exc:
        if exc.errno in _BUSY:
            return False
        raise
    return True


def mark(handle, state: str) -> None:
    """Write the lock holder's state ("serving", "flushing") into its lock file."""
    handle.seek(0)
    handle.truncate()
    handle.write(state.encode())
    handle.flush()


def marked(directory: Path) -> str:
    """The state the lock holder wrote ("" when none)."""
    try:
        return (directory / LOCK_NAME).read_text()[:16]
    except (OSError, UnicodeDecodeError):
        return ""


def is_locked(directory: Path) -> bool:
    """Whether a runner holds this layout directory now (a shared lock for the moment: see
    `lock`). Raises OSError for a directory this process cannot use (another user's)."""
    if not directory.is_dir():
        return False
    with open(directory / LOCK_NAME, "a+b") as handle:
        return not _try_flock(handle, fcntl.LOCK_SH)


def forget(worker_dir: Path, forget: forgets.Forget, *, wait_s: float = 0.0) -> int:
    """Do a recorded forget (tiers.forgets.record) in every layout directory of its models
    under a worker's directory; returns the files (entries, images) deleted here. A directory
    nobody holds is done here, under its lock (with every recorded forget it has not applied).
    One a runner holds is that runner's to do (it applies the record: a store serving, starting
    or stopping alike) and is waited for, up to `wait_s`, until it says it has, or lets go (then
    it is done here). A directory that is not done by then is done by whoever opens it next."""
    worker_dir = Path(worker_dir)
    models = ([worker_dir / key for key in forget.models] if forget.models
              else sorted(p for p in worker_dir.glob("*") if p.is_dir()))  # fmt: skip
    deadline = time.monotonic() + wait_s
    deleted, all_here = 0, True
    for model_dir in models:
        for directory in sorted(model_dir.glob("*")):
            if not directory.is_dir():
                continue
            if directory.name.startswith(TRASH):  # a forget killed midway
                shutil.rmtree(directory, ignore_errors=True)
                continue
            while True:
                done = _forget_unheld(worker_dir, directory)
                if done is not None:
                    deleted += done
                    break
                all_here = False
                if forgets.applied(directory) >= forget.seq:
                    break
                if time.monotonic() >= deadline:
                    if wait_s:
                        log.warning("%s has not forgotten its kept prompts yet; it does when "
                                    "its runner next looks, or opens it", directory)  # fmt: skip
                    break
                time.sleep(0.05)
        if forget.everything and model_dir.is_dir() and not any(model_dir.iterdir()):
            model_dir.rmdir()
    if all_here and not forget.models:  # no runner holds anything: every forget is done
        forgets.compact(worker_dir, forget.seq)
    return deleted


def _forget_unheld(worker_dir: Path, directory: Path) -> int | None:
    """`apply_forgets` under the directory's lock; None when a runner holds it."""
    handle = lock(directory)
    if handle is None:
        return None
    try:
        # A runner starting meanwhile takes the directory over once this lets go (as from a
        # runner writing its RAM tier), instead of keeping its prompts in RAM only.
        mark(handle, "flushing")
        deleted = apply_forgets(worker_dir, directory)
        if deleted:
            _release(directory)
        return deleted
    finally:
        handle.close()


def _release(directory: Path) -> None:
    """The disk ledger counts a directory again after a forget deleted from it (ledger.recount:
    what it takes is given back to the runners alive now)."""
    from inference.engine.tiers import ledger  # it builds on this module

    try:
        ledger.recount(directory)
    except OSError as exc:  # counted again at the next open, or before evicting from it
        log.warning("kept prompts: the disk ledger was not told of a forget in %s: %s",
                    directory, exc)  # fmt: skip


def apply_forgets(worker_dir: Path, directory: Path) -> int:
    """(Under the directory's lock, which the caller holds.) Delete the entries and images the
    recorded forgets it has not applied cover, and say so; returns the files deleted. A
    directory whose every entry goes is renamed before it is deleted, so a kill midway leaves
    nothing under a layout's name."""
    done = forgets.applied(directory)
    recorded = forgets.read(worker_dir, after=done)
    if not recorded:
        return 0
    model = directory.parent.name
    mine = [f for f in recorded if f.concerns(model)]
    if any(f.everything for f in mine):
        paths = entry_files(directory) + [path for _, _, path in images.stored(directory)]
        trash = directory.with_name(f"{TRASH}{os.getpid()}-{time.monotonic_ns()}")
        directory.rename(trash)
        shutil.rmtree(trash, ignore_errors=True)
        return len(paths)
    # A partition's images go with its kept prompts (tiers.images).
    deleted = sum(images.forget(directory, partition) for partition in {f.partition for f in mine})
    for path in entry_files(directory):
        partition = _partition_of(path)
        if mine and (partition is _UNREADABLE or any(f.covers(model, partition) for f in mine)):
            path.unlink(missing_ok=True)
            deleted += 1
    forgets.mark_applied(directory, max(f.seq for f in recorded))
    return deleted


def conversations(worker_dir: Path, limit: int) -> list[str]:
    """The conversations (cache keys) kept on disk under a worker's directory, the most
    recently written first, at most `limit`."""
    paths = []
    for path in Path(worker_dir).glob(f"*/*/*{SUFFIX}"):
        try:
            paths.append((path.stat().st_mtime_ns, path))
        except FileNotFoundError:
            continue
    keys: dict[str, None] = {}
    for _, path in sorted(paths, reverse=True):
        header = _header_of(path)
        key = header.get("cache_key") if isinstance(header, dict) else None
        if isinstance(key, str) and key:
            keys[key] = None
            if len(keys) >= limit:
                break
    return list(keys)


_UNREADABLE = object()


def _partition_of(path: Path):
    """An entry's partition from its header alone (any layout), or _UNREADABLE."""
    header = _header_of(path)
    return header.get("partition") if isinstance(header, dict) else _UNREADABLE


def _header_of(path: Path) -> dict | None:
    """An entry's header fields, unchecked (any layout); None when it is not an entry."""
    try:
        with open(path, "rb") as source:
            magic, version, _, header_len = framing.PREFIX.unpack(
                source.read(framing.PREFIX.size))
            if magic != MAGIC or version != FORMAT or header_len > MAX_HEADER:
                return None
            fields = json.loads(source.read(header_len))
            return fields if isinstance(fields, dict) else None
    except (OSError, ValueError, struct.error):
        return None


def stored(directory: Path) -> Iterator[tuple[int, int, Path]]:
    """(modification time, size, path) of every entry, image (tiers.images) and temporary file
    in a layout directory: what it takes on the disk. Files that vanish meanwhile are skipped."""
    yield from images.stored(directory)
    yield from framing.stored_files(directory, (SUFFIX, TEMPORARY))


def entry_files(directory: Path) -> list[Path]:
    try:
        return sorted(p for p in directory.iterdir() if p.suffix == SUFFIX)
    except FileNotFoundError:
        return []


def _count(fields: dict, key: str) -> int:
    value = fields.get(key)
    if type(value) is not int or value < 0:
        raise BadEntry(f"its header's {key} is not a count")
    return value


def _text(fields: dict, key: str, *, required: bool = False) -> str | None:
    value = fields.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value or len(value) > 256:
        raise BadEntry(f"its header's {key} is not a name")
    return value
