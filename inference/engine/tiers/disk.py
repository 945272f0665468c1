"""The disk tier: a model's directory of kept prompts and the one thread that reads and writes it.

The engine thread never waits on the disk: writes (spills from the RAM tier) and reads (a disk
hit being fetched for a restore) are jobs for this tier's thread, whose results come back
through `notify` (the engine puts them on its inbox and the store applies them between steps).
`open()` is the exception: at load, before the runner says it is ready, it takes the directory's
lock, removes what a killed runner left (`.tmp` files), indexes the entries, checking every
header, and joins the tree's ledger (ledger.Ledger: the bound is the box's, shared by the
runners alive, and each write reserves its bytes first). Entries of other load settings of the
same model stay in their own directories, within the bound, for when those settings come back;
those a directory of this layout's key holds under its name from before (when the context and
GPU offload were in it) move into this one, once the recorded forgets (tiers.forgets) that
directory had not applied are done in it. Before it indexes anything, open() deletes what the
recorded forgets this directory has not applied cover. While idle, the thread looks at the log
of forgets and tells the store (`on_idle`), which applies new ones and has the thread say so
(`acknowledge`).

An entry dropped at open (unreadable, or longer than this load's context) is said in `note`,
which the model page shows. Every failure is a log line and a cold read, never a crash: a full
disk while spilling, a file deleted or corrupted behind the appliance's back (its fetch fails
its checks; the entry is dropped), a directory another runner holds (this one runs without a
disk tier), one that is another user's (left alone).

A vision model's encoded images live here too (tiers.images: `images/<partition>/`), so a
picture sent again after an unload or a restart is not encoded again. The encoder thread reads
them (`read_image`, checked: a bad file is deleted and the picture encoded again) and hands its
new ones to this thread (`write_image`), which writes them as it writes entries: each reserved
in the ledger first, within their share of the bound (`image_share`, the oldest out first), a
write that a forget recorded since it was queued covers dropped. They count in what the
directory holds, and a forget deletes a partition's images with its entries.
"""

import logging
import os
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from inference.engine.tiers import files, forgets, images
from inference.engine.tiers.entries import KvEntry, KvLayout
from inference.engine.tiers.ledger import Ledger

log = logging.getLogger(__name__)

# How often the disk thread reads its share again (runners opened or stopped meanwhile).
REFRESH_S = 1.0
IDLE_POLL_S = 0.25  # how often an idle disk thread looks for new forgets (a stat)
# The share of the directory's room a vision model's encoded images may take (its kept prompts
# the rest): 64 image tokens of the starter are 147 KB, its KV 1.5 MB.
IMAGE_SHARE = 0.25
# The disk thread's jobs that nobody waits for a result of: a failure is its log line alone.
_UNANSWERED = ("delete", "acknowledge", "image", "drop image", "forget images")


@dataclass(slots=True, frozen=True)
class DiskResult:
    """A job done: `op` "write" or "read"; `data` the state read (None when it failed);
    `error` why it failed; `seconds` what the disk took."""

    op: str
    entry: KvEntry
    ok: bool
    seconds: float
    data: bytearray | None = None
    error: str = ""


class DiskTier:
    def __init__(self, root: Path, layout: KvLayout, bound: int, *,
                 box_root: Path | None = None, image_share: float = 0.0):  # fmt: skip
        """`root`: the worker's directory of kept prompts; `bound`: bytes, for every directory
        under `box_root` together (the directory of every worker's on this box; root alone
        when None); `image_share`: the share of this directory's room kept for encoded images
        (0: none are written; a model without a projector)."""
        self.root = Path(root)
        self.layout = layout
        self.bound = bound
        self.directory = self.root / layout.model_key / layout.digest
        # The entries' bytes (their states) this directory may hold now: its share of the
        # bound less its files' headers and token ids, and room for the next one's.
        self.budget = bound
        self.note = ""  # what open() dropped and why ("" : nothing)
        self.notify: Callable[[DiskResult], None] = lambda result: None
        # Asked before a read allocates anything: False, and the read does not happen (the
        # store takes the read's room in RAM first, or queues it again, or gives it up).
        self.admit_read: Callable[[KvEntry], bool] = lambda entry: True
        # Told when the budget shrank (another runner opened): the store trims to it.
        self.shrunk: Callable[[], None] = lambda: None
        self._ledger = Ledger(Path(box_root or root), self.directory, bound)
        self._files: dict[str, tuple[int, int]] = {}  # entry id -> (file bytes, state bytes)
        if not 0.0 <= image_share < 1.0:
            raise ValueError("the images' share is a fraction of the directory's room")
        self.image_share = image_share
        self._images: OrderedDict[Path, int] = OrderedDict()  # image file -> bytes, oldest first
        self._images_bytes = 0
        self._refreshed_at = 0.0  # when the share was read last (disk thread)
        self.on_idle: Callable[[], None] = lambda: None  # the store's look for new forgets
        self.forgets_seen = 0  # the latest forget open() applied to the files (tiers.forgets)
        self._lock_handle = None
        self._jobs: queue.Queue = queue.Queue()
        self._idle = threading.Condition()
        self._busy = 0
        self._thread: threading.Thread | None = None

    # --- opening -----------------------------------------------------------------------------

    def open(self, *, quiet: bool = False) -> list[KvEntry] | None:
        """Take the directory and index its entries (module doc); None when another runner
        holds it or it cannot be made (the runner then keeps prompts in RAM only)."""
        try:
            self._lock_handle = files.lock(self.directory)
        except OSError as exc:
            log.warning("kept prompts stay in RAM: cannot use %s (%s)", self.directory, exc)
            return None
        if self._lock_handle is None:
            if not quiet:
                log.warning("kept prompts stay in RAM: another runner holds %s%s",
                            self.directory, " (it is writing its own to disk)"
                            if self.holder_flushing() else "")  # fmt: skip
            return None
        try:
            files.mark(self._lock_handle, "serving")
            for leftover in self.directory.glob(f"*{files.TEMPORARY}"):
                leftover.unlink(missing_ok=True)
            for leftover in self.directory.glob(f"{images.DIRECTORY}/*/*{images.TEMPORARY}"):
                leftover.unlink(missing_ok=True)
            self._adopt_earlier_directories()
            entries = self._index(self._forgets_to_apply())
            self._ledger.open(self._held())
        except OSError as exc:
            log.warning("kept prompts stay in RAM: cannot use %s (%s)", self.directory, exc)
            self._lock_handle.close()
            self._lock_handle = None
            return None
        self._new_budget()
        self._thread = threading.Thread(target=self._work, name="kv-disk", daemon=True)
        self._thread.start()
        return entries

    def holder_flushing(self) -> bool:
        """Whether the runner holding the directory is a stopped one writing its RAM tier."""
        return files.marked(self.directory) == "flushing"

    def others_flushing(self, within: float = 60.0) -> bool:
        """Whether a stopped runner of this worker (any model) still writes its RAM tier: that
        RAM is still held, and the store keeps its own tier empty until it is let go of. Only
        a directory marked so in the last `within` seconds (a flush's limit, config.FLUSH_S,
        and more) is probed for its lock (files.is_locked's shared probe, which a starting
        runner waits out): the mark stays after the runner is gone."""
        now = time.time()
        for directory in self.root.glob("*/*"):
            try:
                recent = now - (directory / files.LOCK_NAME).stat().st_mtime < within
                if recent and files.marked(directory) == "flushing" and files.is_locked(directory):
                    return True
            except OSError:  # gone meanwhile, or another user's: no runner of this worker's
                continue
        return False

    def flushing(self) -> None:
        """Say that this runner has stopped and only writes its RAM tier now: a runner of the
        same model started meanwhile takes the directory over when this one lets go."""
        if self._lock_handle is not None:
            files.mark(self._lock_handle, "flushing")

    def _adopt_earlier_directories(self) -> None:
        """Entries of this layout's key in another directory of the model (named as before the
        context and the GPU offload left the name) move here, once; a directory of other
        settings is left as it is (one entry's header says which it is)."""
        for other in sorted(self.directory.parent.iterdir()):
            # Not this one, nor one a forget is deleting whole (files.TRASH: a dot name).
            if other == self.directory or other.name.startswith(".") or not other.is_dir():
                continue
            try:
                self._adopt(other)
            except OSError as exc:  # another user's, say: the ledger logs it and leaves it
                log.debug("kept prompts: %s not taken over: %s", other, exc)

    def _adopt(self, other: Path) -> None:
        sample = next(iter(files.entry_files(other)), None)
        try:
            if sample is None:
                return
            files.read_header(sample, self.layout)
        except files.BadEntry:
            return
        held = files.lock(other)
        if held is None:
            return
        try:
            # What the forgets recorded since that directory last applied them cover goes
            # first: moved as it is, it would land in a directory that applied them already.
            files.apply_forgets(self.root, other)
            moved = 0
            for path in files.entry_files(other):
                os.replace(path, self.directory / path.name)
                moved += 1
            log.info("kept prompts of %s: %d entries taken over from %s",
                     self.layout.model_key[:12], moved, other.name)  # fmt: skip
        finally:
            held.close()

    def _forgets_to_apply(self) -> list[forgets.Forget]:
        """The recorded forgets of this model that this directory has not applied yet."""
        done = forgets.applied(self.directory)
        recorded = forgets.read(self.root, after=done)
        self.forgets_seen = max([done] + [f.seq for f in recorded])
        return [f for f in recorded if f.concerns(self.layout.model_key)]

    def _index(self, forgotten: list[forgets.Forget]) -> list[KvEntry]:
        """The directory's entries, checked; those this load cannot use are deleted and said
        in `note`, and those `forgotten` covers deleted."""
        entries = []
        dropped: dict[str, int] = {}
        for path in files.entry_files(self.directory):
            try:
                header = files.read_header(path, self.layout)
                if path.stem != header.id:
                    raise files.BadEntry("it is named for another entry")
            except files.BadEntry as exc:
                log.warning("deleting kept prompt %s: %s", path.name, exc)
                path.unlink(missing_ok=True)
                dropped["damaged or unreadable"] = dropped.get("damaged or unreadable", 0) + 1
                continue
            if any(f.covers(self.layout.model_key, header.partition) for f in forgotten):
                path.unlink(missing_ok=True)  # forgotten while a runner held it, or killed
                continue
            if len(header.tokens) > self.layout.ctx_per_seq:
                path.unlink(missing_ok=True)
                why = f"longer than this load's context ({self.layout.ctx_per_seq} tokens)"
                dropped[why] = dropped.get(why, 0) + 1
                continue
            entries.append(KvEntry(header.id, header.partition, header.cache_key,
                                   header.tokens, header.payload_bytes, on_disk=True))  # fmt: skip
            self._files[header.id] = (path.stat().st_size, header.payload_bytes)
        if dropped:
            self.note = "dropped " + ", ".join(
                f"{n} {'entry' if n == 1 else 'entries'}: {why}" for why, n in dropped.items()
            )
            log.info("kept prompts of %s: %s", self.layout.model_key[:12], self.note)
        # Most recently written last, so the store's LRU order starts as the disk's.
        entries.sort(key=lambda e: _mtime(files.entry_path(self.directory, e.id)))
        self._index_images(forgotten)
        return entries

    def _index_images(self, forgotten: list[forgets.Forget]) -> None:
        """The images the directory holds, oldest first, those `forgotten` covers deleted
        (each is checked when it is read)."""
        for forget in forgotten:
            images.forget(self.directory, forget.partition, everything=forget.everything)
        for _, size, path in sorted(images.stored(self.directory)):
            self._images[path] = size
            self._images_bytes += size

    def _held(self) -> int:
        return sum(size for size, _ in self._files.values()) + self._images_bytes

    def _image_room(self) -> int:
        return int(self._ledger.share * self.image_share)

    def _new_budget(self) -> None:
        """`budget` from the share read last; the store is told when it shrank."""
        # Beside the entries' headers and token ids, the images' room, or what they hold.
        overhead = sum(size - state for size, state in self._files.values())
        overhead += max(self._images_bytes, self._image_room())
        room_for_next = files.HEADER_ROOM + 4 * self.layout.ctx_per_seq
        budget = max(0, self._ledger.share - overhead - room_for_next)
        shrank, self.budget = budget < self.budget, budget
        if shrank:
            self.shrunk()

    # --- jobs --------------------------------------------------------------------------------

    def write(self, entry: KvEntry) -> None:
        self._submit(("write", entry, entry.data))

    def read(self, entry: KvEntry) -> None:
        self._submit(("read", entry, None))

    def delete(self, entry: KvEntry) -> None:
        self._submit(("delete", entry, None))

    def write_image(self, partition: str | None, key: str, embeddings: np.ndarray) -> None:
        """(The encoder thread.) Keep an image's embeddings, written on this tier's thread."""
        if self._thread is None or not self.image_share:
            return
        # A forget recorded after this is read covers the image (the encoder has just made it
        # for a request of that partition): the write then does not happen.
        try:
            seen = forgets.last(self.root)
        except OSError as exc:  # an unreadable log: kept in RAM only, the request goes on
            log.warning("encoded image %s not kept on disk: %s", key[:12], exc)
            return
        self._submit(("image", None, (partition, key, embeddings, seen)))

    def read_image(self, partition: str | None, key: str, rows: int,
                   cols: int) -> np.ndarray | None:  # fmt: skip
        """(The encoder thread.) An image's embeddings as they were written, rows x cols, or
        None: none kept, or a bad file, which this tier's thread deletes."""
        if self._thread is None:
            return None
        try:
            path = images.image_path(self.directory, partition, key)
            return images.read(path, key, rows, cols)
        except FileNotFoundError:
            return None
        except images.BadImage as exc:
            log.warning("encoded image %s is unusable (%s): deleted; it is encoded again",
                        path.name, exc)  # fmt: skip
            self._submit(("drop image", None, path))
            return None

    def forget_images(self, partition: str | None, *, everything: bool = False) -> None:
        """Delete a partition's images (everything: all), after the jobs queued so far."""
        self._submit(("forget images", None, (partition, everything)))

    def acknowledge(self, seq: int) -> None:
        """Say in the directory that its entries are forgotten up to `seq`, once the jobs
        queued so far are done (the deletions of what those forgets dropped among them)."""
        self._submit(("acknowledge", None, seq))

    def _submit(self, job: tuple) -> None:
        with self._idle:
            self._busy += 1
        self._jobs.put(job)

    def drain(self, timeout: float) -> bool:
        """Wait until every job so far is done (results already notified); False on timeout."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    def _refresh(self) -> None:
        self._refreshed_at = time.monotonic()
        try:
            self._ledger.refresh()
        except OSError as exc:
            log.warning("kept prompts: cannot read the disk ledger: %s", exc)
            return
        self._trim_images(0)  # the share shrank (a runner opened beside this one), theirs too
        self._new_budget()

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(5)
            stopped, self._thread = not self._thread.is_alive(), None
            try:
                if stopped:  # else what it holds is its own to say, when its job ends
                    self._ledger.close(self._held())
            except OSError as exc:
                log.warning("kept prompts: cannot write the disk ledger: %s", exc)
        if self._lock_handle is not None:
            self._lock_handle.close()
            self._lock_handle = None

    def _work(self) -> None:
        while True:
            if time.monotonic() >= self._refreshed_at + REFRESH_S:
                self._refresh()
            try:
                job = self._jobs.get(timeout=IDLE_POLL_S)
            except queue.Empty:
                self._idle_look()
                continue
            if job is None:
                break
            op, entry, data = job
            started = time.perf_counter()
            try:
                result = self._run(op, entry, data, started)
            except Exception as exc:  # noqa: BLE001 - a job's failure is a result, not a crash
                log.exception("kept prompt %s: %s failed", entry.id if entry else "-", op)
                seconds = time.perf_counter() - started
                # A deletion's or an acknowledgement's failure is the log line alone: nothing
                # waits for it (a forget not said applied is applied again, to nothing).
                failed = op in _UNANSWERED
                result = None if failed else DiskResult(op, entry, False, seconds, error=str(exc))
            if result is not None:
                try:
                    self.notify(result)
                except Exception:  # noqa: BLE001
                    log.exception("delivering a disk result")
            # A written or dropped state is let go of now, not when the next job comes: the
            # store counts it out of RAM once this job is done.
            job = data = entry = result = None
            with self._idle:
                self._busy -= 1
                self._idle.notify_all()

    def _idle_look(self) -> None:
        """No job waiting: the store looks for new forgets (on_idle)."""
        try:
            self.on_idle()
        except Exception:  # noqa: BLE001 - the next look tries again
            log.exception("looking for forgotten prompts")

    def _run(self, op: str, entry: KvEntry, data, started: float) -> DiskResult | None:
        if op == "acknowledge":
            forgets.mark_applied(self.directory, data)
            return None
        if op == "image":
            self._write_image(*data)
            return None
        if op == "drop image":
            self._drop_images([data])
            return None
        if op == "forget images":
            partition, everything = data
            images.forget(self.directory, partition, everything=everything)
            name = images.partition_name(partition)
            self._drop_images([p for p in self._images if everything or p.parent.name == name])
            return None
        path = files.entry_path(self.directory, entry.id)
        if op == "delete":
            path.unlink(missing_ok=True)
            if self._files.pop(entry.id, None) is not None:
                self._settle()
            return None
        if op == "write":
            return self._write(entry, data, path, started)
        if not self.admit_read(entry):
            return None
        try:
            payload = files.read_payload(path, self.layout, entry)
        except files.BadEntry as exc:
            log.warning("kept prompt %s is unusable (%s): deleted; its prompt is read again",
                        entry.id, exc)  # fmt: skip
            path.unlink(missing_ok=True)
            if self._files.pop(entry.id, None) is not None:
                self._settle()
            return DiskResult(op, entry, False, time.perf_counter() - started, error=str(exc))
        return DiskResult(op, entry, True, time.perf_counter() - started, data=payload)

    def _write(self, entry: KvEntry, data, path: Path, started: float) -> DiskResult:
        """Reserve the file's bytes in the ledger, write it, say what the directory holds."""
        op = "write"
        if entry.dropped:
            return DiskResult(op, entry, False, 0.0, error="dropped before it was written")
        if not self._ledger.reserve(self._held(), files.entry_size(self.layout, entry, len(data))):
            self._new_budget()
            log.debug("kept prompt %s (%d bytes) not written: the disk bound is full",
                      entry.id, entry.n_bytes)  # fmt: skip
            return DiskResult(op, entry, False, 0.0, error="the disk bound is full")
        try:
            size = files.write_entry(self.directory, self.layout, entry, data)
        except OSError as exc:
            self._settle()
            log.warning("could not spill kept prompt %s (%d bytes) to %s: %s",
                        entry.id, entry.n_bytes, self.directory, exc)  # fmt: skip
            return DiskResult(op, entry, False, time.perf_counter() - started, error=str(exc))
        if entry.dropped:  # forgotten while it was being written
            path.unlink(missing_ok=True)
            self._settle()
            return DiskResult(op, entry, False, 0.0, error="dropped while it was written")
        self._files[entry.id] = (size, entry.n_bytes)
        self._settle()
        return DiskResult(op, entry, True, time.perf_counter() - started)

    def _write_image(self, partition: str | None, key: str, embeddings: np.ndarray,
                     seen: int) -> None:  # fmt: skip
        """Reserve an image file's bytes in the ledger, within the images' room (the oldest
        out first), write it, say what the directory holds."""
        recorded = forgets.read(self.root, after=seen)
        if any(f.covers(self.layout.model_key, partition) for f in recorded):
            return  # forgotten since it was encoded
        path = images.image_path(self.directory, partition, key)
        if path in self._images:  # two requests encoded it at once
            return
        n = images.file_size(key, embeddings)
        if n > self._image_room():
            return
        self._trim_images(n)
        if not self._ledger.reserve(self._held(), n):
            self._new_budget()
            log.debug("encoded image %s not written: the disk bound is full", key[:12])
            return
        try:
            size = images.write(path, key, embeddings)
        except OSError as exc:
            self._settle()
            log.warning("could not write encoded image %s to %s: %s", key[:12], path.parent, exc)
            return
        self._images[path] = size
        self._images_bytes += size
        self._settle()

    def _trim_images(self, n: int) -> None:
        """The oldest images go until n more bytes fit the images' room."""
        oldest, excess = [], self._images_bytes + n - self._image_room()
        for old, size in self._images.items():
            if excess <= 0:
                break
            oldest.append(old)
            excess -= size
        if oldest:
            self._drop_images(oldest)

    def _drop_images(self, paths: list[Path]) -> None:
        for path in paths:
            path.unlink(missing_ok=True)
            self._images_bytes -= self._images.pop(path, 0)
        self._settle()

    def _settle(self) -> None:
        self._refreshed_at = time.monotonic()
        self._ledger.settle(self._held())
        self._new_budget()


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return 0
