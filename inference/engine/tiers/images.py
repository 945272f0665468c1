"""Encoded images on disk: the format of one file, and the directory of a partition's images.

The disk tier keeps an image's embeddings (vision.Encoder's, one float32 row per image
position) beside the kept prompts of its model and layout, so that a picture sent again after
an unload or a restart is not encoded again:

    <layout dir>/images/<partition_name(partition)>/<embedding key>.img

    b"APIM"  u16 format  u16 0  u32 header length  header (JSON)  u32 crc32 of the header
    payload (float32, little-endian, rows x cols)

(tiers.framing's frame, as kept prompts' files have it)
The header names the embedding key (vision.embedding_key: the image and projector within one
partition), the rows, the columns, the dtype and the payload's crc32. A file is used only when
all of them are what the reader expects (`read`: its key, its span's length, the model's input
width) and its size is exactly what the header says; anything else raises BadImage, and the
reader deletes it and encodes the picture again. A partition's images have a directory of their
own, so forgetting a partition (tiers.forgets) deletes it whole (`forget`): one app's pictures
are never found, counted or kept in another's.
"""

import hashlib
import json
import os
import shutil
import zlib
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from inference.engine.tiers import framing

DIRECTORY = "images"
SUFFIX = ".img"
TEMPORARY = ".tmp"
MAGIC = b"APIM"
FORMAT = 1
MAX_HEADER = 4 << 10
_DTYPE = "<f4"
_HEX = frozenset("0123456789abcdef")


class BadImage(ValueError):
    """A file that is not an image of this key and shape, is short, or fails a checksum."""


def partition_name(partition: str | None) -> str:
    """The directory name of a partition's images: a digest, so a partition's name (an API
    key's id, a user's) is never written on the disk, and every name is a safe one."""
    owner = "none" if partition is None else f"p:{partition}"
    return hashlib.sha256(f"images\n{owner}".encode()).hexdigest()[:32]


def partition_dir(directory: Path, partition: str | None) -> Path:
    return Path(directory) / DIRECTORY / partition_name(partition)


def image_path(directory: Path, partition: str | None, key: str) -> Path:
    if len(key) != 64 or not set(key) <= _HEX:
        raise ValueError("an image's key is a sha256 in hex")
    return partition_dir(directory, partition) / f"{key}{SUFFIX}"


def file_size(key: str, embeddings: np.ndarray) -> int:
    """The bytes the file of `embeddings` will take, before it is written (what a write
    reserves in the ledger): its checksum is written at its widest."""
    return framing.framed_size(_header(key, embeddings.shape, 0xFFFFFFFF), embeddings.size * 4)


def _header(key: str, shape: tuple[int, ...], crc: int) -> bytes:
    rows, cols = shape
    return json.dumps({"key": key, "rows": rows, "cols": cols, "dtype": _DTYPE,
                       "payload_crc": crc}, sort_keys=True).encode()  # fmt: skip


def write(path: Path, key: str, embeddings: np.ndarray) -> int:
    """Write an image's embeddings (n_tokens x n_embd) under a temporary name and rename it;
    returns the bytes written. Raises OSError (a full disk: nothing is left behind)."""
    if embeddings.ndim != 2:
        raise ValueError("an image's embeddings are rows of one width")
    payload = np.ascontiguousarray(embeddings, dtype=_DTYPE).tobytes()
    header = _header(key, embeddings.shape, zlib.crc32(payload))
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    return framing.write(path, TEMPORARY, MAGIC, FORMAT, header, payload)


def read(path: Path, key: str, rows: int, cols: int) -> np.ndarray:
    """The embeddings a file holds, float32 rows x cols, checked (module doc); raises BadImage,
    or FileNotFoundError when there is none."""
    try:
        with open(path, "rb") as source:
            size = os.fstat(source.fileno()).st_size
            fields, header_len = framing.read_header(source, MAGIC, FORMAT, MAX_HEADER,
                                                     what="an image", bad=BadImage)  # fmt: skip
            if fields.get("key") != key:
                raise BadImage("it holds another image")
            if fields.get("dtype") != _DTYPE:
                raise BadImage("its rows are not float32")
            if fields.get("rows") != rows or fields.get("cols") != cols:
                raise BadImage(f"{fields.get('rows')} x {fields.get('cols')} where "
                               f"{rows} x {cols} are wanted")  # fmt: skip
            n_payload = rows * cols * 4
            if size != framing.framed_size(b"", header_len + n_payload):
                raise BadImage("its size is not what its header says")
            payload = source.read(n_payload)
    except FileNotFoundError:
        raise
    except (OSError, ValueError) as exc:
        if isinstance(exc, BadImage):
            raise
        raise BadImage(f"unreadable: {exc}") from None
    if len(payload) != n_payload or zlib.crc32(payload) != fields.get("payload_crc"):
        raise BadImage("its rows fail their checksum")
    return np.frombuffer(payload, dtype=_DTYPE).astype(np.float32).reshape(rows, cols)


def stored(directory: Path) -> Iterator[tuple[int, int, Path]]:
    """(modification time, size, path) of every image and temporary file under a layout
    directory's images: what they take on the disk. Files that vanish meanwhile are skipped."""
    try:
        partitions = [p for p in (Path(directory) / DIRECTORY).iterdir() if p.is_dir()]
    except OSError:  # none, or another user's
        return
    for partition in partitions:
        yield from framing.stored_files(partition, (SUFFIX, TEMPORARY))


def forget(directory: Path, partition: str | None = None, *, everything: bool = False) -> int:
    """Delete a partition's images (everything: every partition's) under a layout directory;
    returns the files deleted."""
    target = Path(directory) / DIRECTORY
    if not everything:
        target = target / partition_name(partition)
    n = sum(1 for _ in (stored(directory) if everything else _files(target)))
    shutil.rmtree(target, ignore_errors=True)
    return n


def _files(partition: Path) -> list[Path]:
    try:
        return [p for p in partition.iterdir() if p.suffix in (SUFFIX, TEMPORARY)]
    except OSError:
        return []
