"""Images in the engine: a phase of their own, beside the steps, and remembered by content.

A request with images (GenerationRequest.media) is read by the runner's encoder thread before the
scheduler sees it: the runner has each picture decoded (in a process of its own, so a decoder
crash costs that request only: picture_decoder.py) and splits the prompt into text and image
chunks (libmtmd's mtmd_tokenize), and the projector encodes each image into embeddings, one row
per image position. Meanwhile the steps go on: the encoder has a thread of its own, with its own
threads and a lower OS priority, so running streams keep their ITL target. The request then
enters the queue like any other, its prompt as token ids in which each image position holds a
pseudo id (`media_ids`): negative, derived from the image's content hash and the projector, so
the prefix cache and the tiers compare and keep an image span like text ("tokens keyed by that
hash"), and a second turn about the same picture reuses its KV. The runner feeds those positions
from the embeddings (an embedding batch beside the token batch); nothing ever gives a pseudo id
to llama_decode, and speculation never drafts from or into one (speculation.policy).

A token's KV position is its index in its sequence, except with M-RoPE (Qwen2-VL and its kin):
there an image of nx x ny rows takes max(nx, ny) positions, its rows placed in 2-D from the
first (ImageSpan.mrope), so every position the runner feeds, trims or checks goes through
`kv_position`, and a cached prefix keeps such an image, like one the projector reads whole,
whole or not at all (`reusable`).

Embeddings are kept in a bounded RAM cache by the same key, and where the model keeps prompts
on disk in its disk tier too (tiers.images: the encoder reads them, the disk thread writes
them), so the same picture sent again, after an unload or a restart too, is not encoded again.
Both are partitioned like the prompt cache: a hit is never another partition's, and a forget
drops a partition's images with its kept prompts. A picture that cannot be decoded, or one too
large to decode safely (its header is read first, `check_pictures`), costs that request only:
a clear "invalid" refusal.

A count of a prompt with images (count_tokens: Encoder.count) is read on the same thread, in turn
with the requests' images, and freed at once: decoding and splitting tell how many positions each
image takes; the encode, the expensive part, is left to an answer.

This module imports no llama_cpp: the runner does the llama.cpp part (runner.py, projector.py).
"""

import hashlib
import logging
import os
import queue
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from inference.engine.media import Image
from inference.engine.refusals import RefusalKind, Refused
from inference.engine.tokens import Tokens

log = logging.getLogger(__name__)

# The most pixels a picture may have: its header is read before it is decoded, so a small file
# that claims 100,000 x 100,000 pixels (a decompression bomb) never allocates 30 GB. libmtmd
# resizes every picture to the projector's size itself; 50 megapixels is beyond any camera's.
MAX_PIXELS = 50_000_000
# Encoded images kept in RAM (float32 rows): 64 tokens of the starter's 576 are 147 KB, 256 of
# a 2560-wide model 2.6 MB.
CACHE_BYTES = 256 << 20
ENCODER_NICE = 10  # how much lower the encoder thread's OS priority is than the steps'
_ID_RANGE = 2**31 - 1  # pseudo ids are -1 ... -(2^31 - 1): int32, as the tiers keep token ids


def is_media(token: int) -> bool:
    """Whether a prompt position holds an image's pseudo id rather than a token."""
    return token < 0


def media_ids(key: str, n: int) -> list[int]:
    """The pseudo ids of an image's `n` positions: negative, the same for the same image and
    projector (`key`), different for another (a collision would need two keys whose 31-bit
    starts lie within an image's length of each other)."""
    base = int(key[:16], 16)
    return [-1 - (base + i) % _ID_RANGE for i in range(n)]


def image_key(projector: str, digest: str) -> str:
    """An encoded image's identity: its content hash together with the projector's."""
    return hashlib.sha256(f"{projector}\n{digest}".encode()).hexdigest()


def embedding_key(partition: str | None, key: str) -> str:
    """Where an image's embeddings are cached: its image_key within one cache partition. A hit
    (an image not encoded again, its images_cached figure, its shorter encode) would tell app
    B that app A sent the same picture, so one partition never hits another's; None is one
    partition too. The prompt's pseudo ids stay image_key's alone: the prefix cache that keeps
    them is partitioned already."""
    owner = "none" if partition is None else f"p:{partition}"
    return hashlib.sha256(f"{owner}\n{key}".encode()).hexdigest()


# --- picture headers ---------------------------------------------------------------------------


def picture_size(image: Image) -> tuple[int, int] | None:
    """The width and height a picture's header claims, or None where it cannot be read."""
    data = image.data
    try:
        if image.kind == "png":
            if data[12:16] != b"IHDR":
                return None
            return struct.unpack(">II", data[16:24])
        if image.kind == "gif":
            return struct.unpack("<HH", data[6:10])
        if image.kind == "bmp":
            (size,) = struct.unpack("<I", data[14:18])
            if size == 12:
                return struct.unpack("<HH", data[18:22])
            width, height = struct.unpack("<ii", data[18:26])
            return abs(width), abs(height)
        if image.kind == "jpeg":
            return _jpeg_size(data)
    except struct.error:
        return None
    return None


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # no length
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a start of frame
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return width, height
        i += 2 + length
    return None


def check_pictures(images: tuple[Image, ...], max_pixels: int = MAX_PIXELS) -> None:
    """Refuse, before anything decodes them, pictures whose header cannot be read or that claim
    more than `max_pixels` pixels."""
    for n, image in enumerate(images, start=1):
        size = picture_size(image)
        which = f"image {n}" if len(images) > 1 else "the image"
        if size is None or not size[0] or not size[1]:
            raise Refused(f"{which} is corrupt: its {image.kind.upper()} header cannot be read",
                          kind=RefusalKind.INVALID, field="images")  # fmt: skip
        width, height = size
        if width * height > max_pixels:
            raise Refused(f"{which} is {width} x {height} pixels, more than the "
                          f"{max_pixels / 1e6:g} megapixels an image may have: send it smaller",
                          kind=RefusalKind.INVALID, field="images")  # fmt: skip


# --- what the runner makes of a prompt with images ---------------------------------------------


@dataclass(slots=True, eq=False)
class ImageSpan:
    """One image's places in a prompt: [start, start + n_tokens)."""

    start: int
    n_tokens: int
    key: str  # image_key: its pseudo ids and (with the partition) its cached embeddings' key
    digest: str  # the picture's sha256
    # The projector wants the image decoded in one batch with causal attention off
    # (mtmd_decode_use_non_causal): the scheduler never cuts it.
    whole: bool = False
    embeddings: np.ndarray | None = None  # float32, n_tokens x n_embd, once encoded
    # M-RoPE (Qwen2-VL and its kin; None elsewhere): the image's rows take `n_pos` KV positions,
    # not n_tokens, and each row has four (llama.cpp's sections t, y, x, z). Row i of an image
    # whose first position is p sits at `mrope[0][:, i] + p * mrope[1][:, i]`; its KV cell's
    # position is the t section's, p for every row of a Qwen2-VL image.
    n_pos: int = 0
    mrope: tuple[np.ndarray, np.ndarray] | None = None  # int32 (4, n_tokens): at p = 0, per p

    @property
    def end(self) -> int:
        return self.start + self.n_tokens

    @property
    def skipped(self) -> int:
        """How many fewer positions than tokens the image takes (0 without M-RoPE)."""
        return self.n_tokens - self.n_pos if self.mrope is not None else 0

    def row_positions(self, base: int, first: int, last: int) -> np.ndarray:
        """The M-RoPE positions (4, last - first) of rows [first, last) of the image, its first
        position being `base`."""
        offsets, steps = self.mrope
        return offsets[:, first:last] + base * steps[:, first:last]


def first_position(spans: list[ImageSpan], span: ImageSpan) -> int:
    """The KV position an image of a prompt starts at: its index, less what the M-RoPE images
    before it skipped."""
    return span.start - sum(before.skipped for before in spans if before.end <= span.start)


def kv_position(spans: list[ImageSpan] | None, index: int) -> int:
    """The KV position of a sequence's `index`th token (a prompt's place or an answer's token).

    It is the index itself except after an M-RoPE image, which takes fewer positions than
    tokens: each one before `index` moves it back by ImageSpan.skipped, and every row of such an
    image sits at the image's own t position. llama.cpp keeps a cell's t position, so this is
    what llama_memory_seq_rm and seq_pos_max speak of."""
    if not spans:
        return index
    moved = 0
    for span in spans:
        if index < span.start:
            break
        if index < span.end and span.mrope is not None:
            return int(span.row_positions(span.start - moved, index - span.start,
                                          index - span.start + 1)[0, 0])  # fmt: skip
        moved += span.skipped
    return index - moved


def reusable(spans: list[ImageSpan] | None, n: int) -> int:
    """How much of a cached prefix of `n` tokens a prompt can keep: all of it, except that an
    M-RoPE image (its rows share one KV position, so its KV cannot be cut inside it) and an
    image the projector reads whole (non-causal: each row's KV was computed seeing every other
    row, so its rest cannot be fed after a cut part) are kept whole or not at all."""
    for span in spans or ():
        if span.start < n < span.end and (span.mrope is not None or span.whole):
            return span.start
    return n


@dataclass(slots=True, eq=False)
class MediaPrompt:
    """A prompt with images as the runner read it: token ids with each image's pseudo ids, the
    image spans in order, and the runner's own handle on the chunks it still has to encode."""

    ids: list[int]
    spans: list[ImageSpan]
    native: object = None


def chunk_length(spans: list[ImageSpan], start: int, take: int, *, may_exceed: bool = True) -> int:
    """How many prompt positions from `start` a step may feed, `take` at most by its budget.

    The runner feeds text as a token batch and then images as an embedding batch, so one
    sequence's chunk is a run of text followed by a run of one image: it ends where an image
    ends. An image the projector wants whole is fed whole or not at all in this step: where it
    begins the chunk and does not fit `take`, it goes past the budget if `may_exceed`, else it
    waits (0)."""
    end = start + take
    for span in spans:
        if span.end <= start:
            continue
        if span.start >= end:
            break
        if span.whole:
            if span.end > end and (span.start > start or not may_exceed):
                return span.start - start  # the text before it now, the image in a step of its own
            return span.end - start
        return min(end, span.end) - start
    return take


# --- the encoder cache -------------------------------------------------------------------------


class EmbeddingCache:
    """Encoded images by embedding_key (image_key within a cache partition), least recently
    used dropped first, bounded in bytes."""

    def __init__(self, capacity: int = CACHE_BYTES):
        self.capacity = capacity
        # key -> (its partition, for a forget; its embeddings)
        self._entries: OrderedDict[str, tuple[str | None, np.ndarray]] = OrderedDict()
        self._lock = threading.Lock()
        self.bytes = 0
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> np.ndarray | None:
        with self._lock:
            found = self._entries.get(key)
            if found is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return found[1]

    def put(self, key: str, embeddings: np.ndarray, partition: str | None = None) -> None:
        if embeddings.nbytes > self.capacity:
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.bytes -= old[1].nbytes
            self._entries[key] = (partition, embeddings)
            self.bytes += embeddings.nbytes
            while self.bytes > self.capacity:
                _, (_, dropped) = self._entries.popitem(last=False)
                self.bytes -= dropped.nbytes

    def forget(self, partition: str | None = None, *, everything: bool = False) -> int:
        """Drop a partition's images (everything: all); returns how many."""
        with self._lock:
            gone = [key for key, (owner, _) in self._entries.items()
                    if everything or owner == partition]  # fmt: skip
            for key in gone:
                self.bytes -= self._entries.pop(key)[1].nbytes
            return len(gone)

    def reading(self) -> dict:
        with self._lock:
            return {"entries": len(self._entries), "bytes": self.bytes,
                    "capacity": self.capacity, "hits": self.hits,
                    "misses": self.misses}  # fmt: skip


# --- the encoder thread ------------------------------------------------------------------------


@dataclass(slots=True, eq=False)
class MediaJob:
    request: object  # the engine's Request, its prompt not read yet
    prompt: str
    images: tuple[Image, ...]
    add_special: bool


@dataclass(slots=True, eq=False)
class CountJob:
    """A prompt with images to count, not to encode (count_tokens): read on the encoder
    thread, whose libmtmd context it needs, and freed at once; `future` gets its Tokens."""

    prompt: str
    images: tuple[Image, ...]
    add_special: bool
    future: Future = field(default_factory=Future)


@dataclass(slots=True)
class EncodeFigures:
    """What reading a request's images took: the encode phase of its figures."""

    started: float = 0.0
    ended: float = 0.0
    image_tokens: int = 0
    encoded: int = 0  # images run through the projector
    cached: int = 0  # images whose embeddings were in the cache

    @property
    def seconds(self) -> float:
        return max(0.0, self.ended - self.started)


class EncoderStopped(Exception):
    pass


class ImageShelf(Protocol):
    """Where encoded images outlive the process (tiers.PromptStore: its disk tier's images)."""

    def read_image(self, partition: str | None, key: str, rows: int,
                   cols: int) -> np.ndarray | None: ...  # fmt: skip

    def write_image(self, partition: str | None, key: str, embeddings: np.ndarray) -> None: ...


@dataclass(slots=True)
class _Totals:
    images: int = 0
    cached: int = 0
    from_disk: int = 0  # of the cached ones, read from the shelf (the RAM cache did not have it)
    seconds: float = 0.0
    failed: int = 0


class Encoder:
    """The thread that reads requests' images (runner.read_images, runner.encode_image) beside
    the steps. `done(job, result)` gets a MediaPrompt with every span's embeddings, or the
    Refused that ends that request; it runs on this thread. An image not in the RAM `cache` is
    looked for on the `shelf` (None: there is none) before it is encoded, and kept there once
    encoded."""

    def __init__(self, runner, done: Callable[[MediaJob, object], None], *,
                 cache: EmbeddingCache | None = None, shelf: ImageShelf | None = None,
                 name: str = "", nice: int = ENCODER_NICE):  # fmt: skip
        self.runner = runner
        self.done = done
        self.cache = cache if cache is not None else EmbeddingCache()
        # An image's embeddings are as wide as the model's input (a shelved file is checked).
        width = getattr(runner, "image_width", None)
        self.shelf = shelf if width else None
        self.width = width
        self.nice = nice
        self.cancelled: set[str] = set()  # request ids the engine gave up on (any thread adds)
        self.busy = 0  # images being encoded right now (the step records read it)
        self.totals = _Totals()
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._loop, name=f"encoder-{name}", daemon=True)
        self._stopping = False

    def start(self) -> "Encoder":
        self._thread.start()
        return self

    def submit(self, job: MediaJob) -> None:
        self._queue.put(job)

    def count(self, prompt: str, images: tuple[Image, ...], add_special: bool) -> Future:
        """The ids a prompt with images reads as, each image's positions as pseudo ids: the
        pictures decoded and the prompt tokenized as a request's are (runner.read_images), in
        turn with the requests' images, but nothing encoded. A Future of a Tokens, or of the
        Refused a request with the same images would end with."""
        job = CountJob(prompt, images, add_special)
        self._queue.put(job)
        return job.future

    def stop(self, timeout: float) -> None:
        """Let the image in hand finish, refuse what waits, and end the thread."""
        self._stopping = True
        self._queue.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def _loop(self) -> None:
        try:  # below the steps: on a small CPU the decode threads come first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self.nice)
        except (AttributeError, OSError):
            pass
        while True:
            job = self._queue.get()
            if job is None:
                break
            if self._stopping:
                self._stopped(job)
            elif isinstance(job, CountJob):
                self._count(job)
            else:
                self.done(job, self._read(job))
        while True:  # what was queued behind the stop
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                return
            if job is not None:
                self._stopped(job)

    def _stopped(self, job: MediaJob | CountJob) -> None:
        if isinstance(job, CountJob):
            job.future.set_exception(EncoderStopped("the engine stopped"))
        else:
            self.done(job, EncoderStopped("the engine stopped"))

    def _count(self, job: CountJob) -> None:
        try:
            prompt = self.runner.read_images(job.prompt, job.images, job.add_special)
            self.runner.free_media(prompt)
        except Exception as exc:  # noqa: BLE001 - a picture that breaks costs its count only
            if not isinstance(exc, Refused):
                log.exception("counting the tokens of a prompt with images")
            job.future.set_exception(Refused.of(exc))
            return
        job.future.set_result(Tokens(tuple(prompt.ids)))

    def _read(self, job: MediaJob) -> object:
        request = job.request
        figures = request.encode
        figures.started = time.perf_counter()
        try:
            prompt = self.runner.read_images(job.prompt, job.images, job.add_special)
            try:
                for n, span in enumerate(prompt.spans):
                    if request.id in self.cancelled:
                        raise EncoderStopped("cancelled")
                    partition = request.cache_partition
                    key = embedding_key(partition, span.key)
                    span.embeddings = self.cache.get(key)
                    if span.embeddings is None and self.shelf is not None:
                        span.embeddings = self.shelf.read_image(partition, key, span.n_tokens,
                                                                self.width)  # fmt: skip
                        if span.embeddings is not None:
                            self.cache.put(key, span.embeddings, partition)
                            self.totals.from_disk += 1
                    if span.embeddings is not None:
                        figures.cached += 1
                        continue
                    self.busy += 1
                    try:
                        span.embeddings = self.runner.encode_image(prompt, n)
                    finally:
                        self.busy -= 1
                    self.cache.put(key, span.embeddings, partition)
                    if self.shelf is not None:
                        self.shelf.write_image(partition, key, span.embeddings)
                    figures.encoded += 1
            finally:
                self.runner.free_media(prompt)
            figures.image_tokens = sum(span.n_tokens for span in prompt.spans)
            return prompt
        except EncoderStopped as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - a picture that breaks costs its request only
            if not isinstance(exc, Refused):
                log.exception("reading the images of %s", request.id)
            self.totals.failed += 1
            return Refused.of(exc)
        finally:
            figures.ended = time.perf_counter()
            self.totals.images += figures.encoded
            self.totals.cached += figures.cached
            self.totals.seconds += figures.seconds

    def reading(self) -> dict:
        totals = self.totals
        return {"encoding": self.busy, "images_encoded": totals.images,
                "images_cached": totals.cached, "images_from_disk": totals.from_disk,
                "encode_seconds": round(totals.seconds, 4),
                "failed": totals.failed, "cache": self.cache.reading()}  # fmt: skip
