"""The disk tier: a model's directory of kept prompts and the one thread that reads and writes it.

The engine thread never waits on the disk: writes (spills from the RAM tier) and reads (a disk
hit being fetched for a restore) are jobs for this tier's thread, whose results come back
through `notify` (the engine puts them on its inbox and the store applies them between steps).
`open()` is the exception: at load, before the runner says it is ready, it takes the directory's
lock, removes what a killed runner left (`.tmp` files) and the entries of other layouts of the
same model (saved with other settings or another file), deletes what recorded forgets cover
(tiers.forgets), makes room under the box's bound among other models' directories, and indexes
what is left, checking every header. While idle, the thread looks at the log of forgets and
tells the store (`on_idle`), which applies new ones and has the thread say so (`acknowledge`).

Every failure is a log line and a cold read, never a crash: a full disk while spilling, a file
deleted or corrupted behind the appliance's back (its fetch fails its checks; the entry is
dropped), a directory another runner holds (this one runs without a disk tier).
"""

import logging
import queue
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from inference.engine.tiers import files, forgets
from inference.engine.tiers.entries import KvEntry, KvLayout

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.25  # how often an idle disk thread looks for new forgets (a stat)


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
    def __init__(self, root: Path, layout: KvLayout, bound: int):
        self.root = Path(root)
        self.layout = layout
        self.bound = bound  # bytes, for every model's directory under root together
        self.directory = self.root / layout.model_key / layout.digest
        self.budget = bound  # what this directory may hold (open() takes the others off)
        self.notify: Callable[[DiskResult], None] = lambda result: None
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
        files.mark(self._lock_handle, "serving")
        for leftover in self.directory.glob("*.tmp"):
            leftover.unlink(missing_ok=True)
        self._drop_other_layouts()
        entries = self._index(self._forgets_to_apply())
        mine = sum(e.n_bytes for e in entries)
        self.budget = max(0, self.bound - self._make_room_elsewhere(mine))
        self._thread = threading.Thread(target=self._work, name="kv-disk", daemon=True)
        self._thread.start()
        return entries

    def holder_flushing(self) -> bool:
        """Whether the runner holding the directory is a stopped one writing its RAM tier."""
        return files.marked(self.directory) == "flushing"

    def flushing(self) -> None:
        """Say that this runner has stopped and only writes its RAM tier now: a runner of the
        same model started meanwhile takes the directory over when this one lets go."""
        if self._lock_handle is not None:
            files.mark(self._lock_handle, "flushing")

    def _drop_other_layouts(self) -> None:
        model_dir = self.directory.parent
        for other in model_dir.iterdir():
            if other.is_dir() and other != self.directory and not files.is_locked(other):
                log.info("removing kept prompts of %s saved with other load settings (%s)",
                         self.layout.model_key[:12], other.name)  # fmt: skip
                shutil.rmtree(other, ignore_errors=True)

    def _forgets_to_apply(self) -> list[forgets.Forget]:
        """The recorded forgets of this model that this directory has not applied yet."""
        done = forgets.applied(self.directory)
        recorded = forgets.read(self.root, after=done)
        self.forgets_seen = max([done] + [f.seq for f in recorded])
        return [f for f in recorded if f.concerns(self.layout.model_key)]

    def _index(self, forgotten: list[forgets.Forget]) -> list[KvEntry]:
        entries = []
        for path in files.entry_files(self.directory):
            try:
                header = files.read_header(path, self.layout)
            except files.BadEntry as exc:
                log.warning("deleting kept prompt %s: %s", path.name, exc)
                path.unlink(missing_ok=True)
                continue
            if any(f.covers(self.layout.model_key, header.partition) for f in forgotten):
                path.unlink(missing_ok=True)  # forgotten while a runner held it, or killed
                continue
            if path.stem != header.id:
                log.warning("deleting kept prompt %s: it is named for another entry", path.name)
                path.unlink(missing_ok=True)
                continue
            entries.append(KvEntry(header.id, header.partition, header.cache_key,
                                   header.tokens, header.payload_bytes, on_disk=True))  # fmt: skip
        # Most recently written last, so the store's LRU order starts as the disk's.
        entries.sort(key=lambda e: _mtime(files.entry_path(self.directory, e.id)))
        return entries

    def _make_room_elsewhere(self, mine: int) -> int:
        """Other models' directories under the root share the bound: when they and this one
        would pass it, their oldest entries go (never a directory a runner holds) until this
        one has at least half of it. Returns what the others still hold."""
        others = []
        for path in self.root.glob(f"*/*/*{files.SUFFIX}"):
            if path.parent != self.directory:
                try:
                    stat = path.stat()
                except FileNotFoundError:
                    continue
                others.append((stat.st_mtime_ns, stat.st_size, path))
        held = sum(size for _, size, _ in others)
        if held + mine <= self.bound:
            return held
        locked: dict[Path, bool] = {}
        for _, size, path in sorted(others):
            if held <= self.bound // 2:
                break
            if path.parent not in locked:
                locked[path.parent] = files.is_locked(path.parent)
            if not locked[path.parent]:
                path.unlink(missing_ok=True)
                held -= size
        return held

    # --- jobs --------------------------------------------------------------------------------

    def write(self, entry: KvEntry) -> None:
        self._submit(("write", entry, entry.data))

    def read(self, entry: KvEntry) -> None:
        self._submit(("read", entry, None))

    def delete(self, entry: KvEntry) -> None:
        self._submit(("delete", entry, None))

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

    def close(self) -> None:
        if self._thread is not None:
            self._jobs.put(None)
            self._thread.join(5)
            self._thread = None
        if self._lock_handle is not None:
            self._lock_handle.close()
            self._lock_handle = None

    def _work(self) -> None:
        while (job := self._next_job()) is not None:
            op, entry, data = job
            started = time.perf_counter()
            try:
                result = self._run(op, entry, data, started)
            except Exception as exc:  # noqa: BLE001 - a job's failure is a result, not a crash
                log.exception("kept prompt %s: %s failed", entry.id, op)
                result = DiskResult(op, entry, False, time.perf_counter() - started, error=str(exc))
            if result is not None:
                try:
                    self.notify(result)
                except Exception:  # noqa: BLE001
                    log.exception("delivering a disk result")
            with self._idle:
                self._busy -= 1
                self._idle.notify_all()

    def _next_job(self) -> tuple | None:
        while True:
            try:
                return self._jobs.get(timeout=IDLE_POLL_S)
            except queue.Empty:
                try:
                    self.on_idle()
                except Exception:  # noqa: BLE001 - the next look tries again
                    log.exception("looking for forgotten prompts")

    def _run(self, op: str, entry: KvEntry, data, started: float) -> DiskResult | None:
        if op == "acknowledge":
            forgets.mark_applied(self.directory, data)
            return None
        path = files.entry_path(self.directory, entry.id)
        if op == "delete":
            path.unlink(missing_ok=True)
            return None
        if op == "write":
            if entry.dropped:
                return DiskResult(op, entry, False, 0.0, error="dropped before it was written")
            try:
                files.write_entry(self.directory, self.layout, entry, data)
            except OSError as exc:
                log.warning("could not spill kept prompt %s (%d bytes) to %s: %s",
                            entry.id, entry.n_bytes, self.directory, exc)  # fmt: skip
                return DiskResult(op, entry, False, time.perf_counter() - started,
                                  error=str(exc))  # fmt: skip
            if entry.dropped:  # forgotten while it was being written
                path.unlink(missing_ok=True)
                return DiskResult(op, entry, False, 0.0, error="dropped while it was written")
            return DiskResult(op, entry, True, time.perf_counter() - started)
        try:
            payload = files.read_payload(path, self.layout, entry)
        except files.BadEntry as exc:
            log.warning("kept prompt %s is unusable (%s): deleted; its prompt is read again",
                        entry.id, exc)  # fmt: skip
            path.unlink(missing_ok=True)
            return DiskResult(op, entry, False, time.perf_counter() - started, error=str(exc))
        return DiskResult(op, entry, True, time.perf_counter() - started, data=payload)


def _mtime(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except FileNotFoundError:
        return 0
