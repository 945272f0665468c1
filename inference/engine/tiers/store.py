"""The RAM and disk tiers of kept prompts: what they hold, within their bounds.

1. `put()` keeps a saved sequence in RAM. An entry that a kept one already covers (its tokens a
   prefix of the kept one's, in the same partition) is not kept twice; kept entries that the new
   one covers go. When RAM would pass its bound, the least recently used entries leave it: to
   the disk tier when it has room (its own least recently used entries go first), else they are
   dropped. An entry being written still holds its bytes, and they count until it is written:
   the bound holds for what this process holds, not just for what the index says.
2. `lookup()` finds the entry sharing the longest prefix with a prompt, in that prompt's
   partition only (another partition's entry is never a candidate, even for the same text).
3. `fetch()` has the disk thread read an entry back into RAM for a restore; the request waits
   (the engine is woken when it arrives, `on_fetched`), and a failed read drops the entry.
4. `forget()` drops a partition's entries or all of them; `flush()` writes what RAM holds to
   disk before the runner stops, most recently used first. Forgets recorded in the worker's log
   (tiers.forgets) are applied by `apply_forgets()`: by the engine between steps when the disk
   thread sees a new one (`on_forgets`), by the disk thread itself when no engine serves (before
   it starts, after it stopped), and by `flush()` before it writes anything.

Called from the engine thread, and from the disk thread with its results, under one lock.
"""

import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from inference.engine.tiers import forgets
from inference.engine.tiers.disk import DiskResult, DiskTier
from inference.engine.tiers.entries import KvEntry, as_tokens, shared_prefix

log = logging.getLogger(__name__)

# Shorter sequences are not kept: a restore saves less than its bookkeeping costs.
MIN_TOKENS = 16
# How long a put waits for spills in flight before it drops what does not fit.
SPILL_WAIT_S = 0.05
# A directory a stopped runner still writes to is taken over within this (config.FLUSH_S).
TAKEOVER_S, TAKEOVER_POLL_S = 30.0, 0.2


@dataclass(slots=True, frozen=True)
class Hit:
    entry: KvEntry
    shared: int  # leading prompt tokens it holds


class PromptStore:
    def __init__(
        self, ram_bytes: int, disk: DiskTier | None = None, *, min_tokens: int = MIN_TOKENS
    ):
        if ram_bytes < 0:
            raise ValueError("the RAM tier's bound is a number of bytes")
        self.ram_bound = ram_bytes
        self.disk = disk
        self.min_tokens = min_tokens
        # Told of every read from disk, done or failed, on the disk thread (the engine's wake-up).
        self.on_fetched: Callable[[DiskResult], None] = lambda result: None
        # The engine's: new forgets are recorded, apply them between steps (None: no engine
        # serves, the disk thread applies them).
        self.on_forgets: Callable[[], None] | None = None
        self._forgets: forgets.Watch | None = None
        self._forgets_seen = 0  # every entry held was made after these forgets were applied
        self._model_key = ""
        self.ram_used = 0
        self.disk_used = 0
        self.ram_peak = 0
        self.counts = {"saved": 0, "spilled": 0, "dropped": 0, "fetched": 0, "unreadable": 0,
                       "spill_failed": 0, "forgotten": 0}  # fmt: skip
        self._entries: dict[str, KvEntry] = {}
        self._clock = 0
        self._closed = False
        self._lock = threading.Condition()

    def open(self, *, takeover_s: float = TAKEOVER_S) -> "PromptStore":
        """Index the disk tier's entries (DiskTier.open); without it, RAM only. A directory
        that a stopped runner of the same model still writes to (it was unloaded a moment ago)
        is taken over in the background once it lets go, within `takeover_s`."""
        disk, self.disk = self.disk, None
        if disk is None:
            return self
        self._forgets, self._model_key = forgets.Watch(disk.root), disk.layout.model_key
        self._forgets_seen = forgets.last(disk.root)
        found = disk.open()
        if found is not None:
            self._forgets_seen = max(self._forgets_seen, disk.forgets_seen)  # RAM is empty
            self._attach(disk, found)
        elif disk.holder_flushing():
            threading.Thread(target=self._take_over, args=(disk, takeover_s),
                             name="kv-takeover", daemon=True).start()  # fmt: skip
        return self

    def _take_over(self, disk: DiskTier, within: float) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and not self._closed:
            time.sleep(TAKEOVER_POLL_S)
            found = disk.open(quiet=True)
            if found is not None:
                if self._closed:
                    disk.close()
                else:
                    self._attach(disk, found)
                return
        log.warning("kept prompts stay in RAM: %s was not let go of", disk.directory)

    def _attach(self, disk: DiskTier, found: list[KvEntry]) -> None:
        disk.notify = self._disk_done
        disk.on_idle = self._look_for_forgets  # what RAM holds from before is applied there
        with self._lock:
            for entry in found:
                self._clock += 1
                entry.last_used = self._clock
                self._entries[entry.id] = entry
                self.disk_used += entry.n_bytes
            self.disk = disk
            self._trim_disk(0)
            # The directory is forgotten as far as what this store holds is (RAM, from before
            # a takeover, may be behind the files): no further.
            disk.acknowledge(self._forgets_seen)
        log.info("kept prompts: %d entries (%d MiB) on disk for this model",
                 len(found), self.disk_used >> 20)  # fmt: skip
        self._look_for_forgets()

    @property
    def enabled(self) -> bool:
        return self.ram_bound > 0

    # --- 2. lookup ---------------------------------------------------------------------------

    def lookup(
        self, partition: str | None, prompt: np.ndarray, at_least: int = 1,
        min_fraction: float = 0.0,
    ) -> Hit | None:  # fmt: skip
        """The entry of `partition` sharing the longest prefix with `prompt` (at least
        `at_least` tokens, and at least `min_fraction` of the entry's); of equal ones, the one
        in RAM."""
        best: Hit | None = None
        with self._lock:
            for entry in self._entries.values():
                if entry.partition != partition or entry.dropped:
                    continue
                shared = shared_prefix(entry.tokens, prompt)
                if shared < at_least or shared < min_fraction * entry.n_tokens:
                    continue
                if best is None or (shared, entry.in_ram) > (best.shared, best.entry.in_ram):
                    best = Hit(entry, shared)
        return best

    def discard(self, entry: KvEntry) -> None:
        """Drop an entry llama.cpp refused to restore."""
        with self._lock:
            self._remove(entry)
            self.counts["unreadable"] += 1

    def touch(self, entry: KvEntry) -> None:
        with self._lock:
            self._clock += 1
            entry.last_used = self._clock
            entry.restores += 1

    # --- 1. put ------------------------------------------------------------------------------

    def covers(self, partition: str | None, tokens: list[int]) -> bool:
        """Whether a kept entry already holds these tokens (or more): saving them is waste."""
        ids = as_tokens(tokens)
        with self._lock:
            return any(e.partition == partition and not e.dropped and len(e.tokens) >= len(ids)
                       and shared_prefix(e.tokens, ids) == len(ids)
                       for e in self._entries.values())  # fmt: skip

    def put(
        self, partition: str | None, cache_key: str | None, tokens: list[int], data: bytearray
    ) -> KvEntry | None:
        """Keep a saved sequence (module doc, 1.); None when it is not kept."""
        ids = as_tokens(tokens)
        n = len(data)
        if len(ids) < self.min_tokens or n == 0 or n > self.ram_bound:
            return None
        with self._lock:
            for entry in list(self._entries.values()):
                if entry.partition != partition or entry.dropped:
                    continue
                shared = shared_prefix(entry.tokens, ids)
                if shared == len(ids):  # already kept, whole
                    self._clock += 1
                    entry.last_used = self._clock
                    return None
                if shared == len(entry.tokens):  # the new one holds all of it and more
                    self._remove(entry)
            if not self._make_ram_room(n):
                self.counts["dropped"] += 1
                log.debug("a kept prompt of %d bytes was dropped: spills in flight", n)
                return None
            self._clock += 1
            entry = KvEntry(uuid.uuid4().hex, partition, cache_key, ids, n,
                            last_used=self._clock, data=data)  # fmt: skip
            self._entries[entry.id] = entry
            self._add_ram(n)
            self.counts["saved"] += 1
            return entry

    def _make_ram_room(self, n: int) -> bool:
        """(Under the lock.) Free RAM for n bytes: spill or drop the least recently used."""
        deadline = time.monotonic() + SPILL_WAIT_S
        while self.ram_used + n > self.ram_bound:
            victims = [e for e in self._entries.values()
                       if e.data is not None and e.pending is None]  # fmt: skip
            if victims:
                self._leave_ram(min(victims, key=lambda e: e.last_used))
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._lock.wait(left)  # a spill in flight frees its bytes when written
        return True

    def _leave_ram(self, entry: KvEntry) -> None:
        """(Under the lock.) Take an entry out of RAM: to disk, or gone."""
        if entry.on_disk:
            self._drop_data(entry)
        elif self.disk is not None and self._trim_disk(entry.n_bytes):
            entry.pending = "write"
            self.disk_used += entry.n_bytes
            self.counts["spilled"] += 1
            self.disk.write(entry)
        else:
            self._remove(entry)
            self.counts["dropped"] += 1

    def _trim_disk(self, n: int) -> bool:
        """(Under the lock.) Make the disk tier's room for n more bytes, least recently used
        entries out first (from disk only: one also in RAM stays there)."""
        if self.disk is None or n > self.disk.budget:
            return False
        while self.disk_used + n > self.disk.budget:
            victims = [e for e in self._entries.values() if e.on_disk and e.pending is None]
            if not victims:
                return False
            victim = min(victims, key=lambda e: e.last_used)
            if victim.data is not None:
                victim.on_disk = False
                self.disk_used -= victim.n_bytes
                self.disk.delete(victim)
            else:
                self._remove(victim)
        return True

    # --- 3. fetch ----------------------------------------------------------------------------

    def fetch(self, entry: KvEntry) -> bool:
        """Have the disk thread read `entry` back; False when it cannot come (it is gone), and
        `on_fetched` is then not called for it."""
        with self._lock:
            if entry.dropped:
                return False
            if entry.data is not None or entry.pending == "read":
                return True
            if self.disk is None or not entry.on_disk or entry.pending is not None:
                return False
            entry.pending = "read"
        self.disk.read(entry)
        return True

    def _disk_done(self, result: DiskResult) -> None:
        """The disk thread's results (see DiskTier)."""
        entry = result.entry
        with self._lock:
            entry.pending = None
            if entry.dropped:
                pass  # _remove counted it out and queued the file's deletion
            elif result.op == "write":
                if result.ok:
                    entry.on_disk = True
                    self._drop_data(entry)  # it left RAM to be written
                else:
                    self.disk_used -= entry.n_bytes
                    self.counts["spill_failed"] += 1
                    self._remove(entry)
            elif not result.ok:
                self.counts["unreadable"] += 1
                self._remove(entry)
            elif self._make_room_for_fetch(entry.n_bytes):
                self._clock += 1
                entry.last_used = self._clock  # wanted now: the last to leave RAM again
                entry.data = result.data
                entry.read_seconds = result.seconds
                entry.rereads = 0
                self._add_ram(entry.n_bytes)
                self.counts["fetched"] += 1
            else:
                # RAM is all spills in flight, which free it once written: read it again
                # behind them (the disk thread's jobs run in order), at most twice.
                entry.rereads += 1
                if entry.rereads <= 2:
                    entry.pending = "read"
                    self.disk.read(entry)
                    return
            self._lock.notify_all()
        if result.op == "read":
            self.on_fetched(result)

    def _make_room_for_fetch(self, n: int) -> bool:
        """(Under the lock, on the disk thread.) Room without waiting: entries on disk already
        leave RAM, others spill."""
        while self.ram_used + n > self.ram_bound:
            victims = [e for e in self._entries.values()
                       if e.data is not None and e.pending is None]  # fmt: skip
            if not victims:
                return False
            self._leave_ram(min(victims, key=lambda e: e.last_used))
        return True

    # --- 4. forget and flush -----------------------------------------------------------------

    def forget(self, partition: str | None = None, *, everything: bool = False) -> int:
        """Drop a partition's entries (everything=True: all); returns how many."""
        with self._lock:
            gone = [e for e in self._entries.values()
                    if everything or e.partition == partition]  # fmt: skip
            for entry in gone:
                self._remove(entry)
            self.counts["forgotten"] += len(gone)
            self._lock.notify_all()
        return len(gone)

    def flush(self, timeout: float) -> int:
        """Write what RAM holds to disk (most recently used first, as the disk's room allows)
        and wait for the disk thread up to `timeout`; returns the entries written. Forgets
        recorded before the directory said "flushing" are applied first; files.forget waits
        for the ones after (the disk thread applies them)."""
        if self.disk is None:
            return 0
        self.disk.flushing()
        self.apply_forgets()
        with self._lock:
            waiting = sorted((e for e in self._entries.values()
                              if e.data is not None and not e.on_disk and e.pending is None),
                             key=lambda e: -e.last_used)  # fmt: skip
            written = 0
            for entry in waiting:
                if not self._trim_disk(entry.n_bytes):
                    break
                entry.pending = "write"
                self.disk_used += entry.n_bytes
                self.disk.write(entry)
                written += 1
        self.disk.drain(timeout)
        return written

    def _look_for_forgets(self) -> None:
        """(The disk thread, while idle.) New forgets recorded: the engine applies them between
        steps (its slots hold prompts too), or this thread when no engine serves."""
        if self._forgets is None or self._forgets.look() <= self._forgets_seen:
            return
        on_forgets = self.on_forgets
        if on_forgets is not None:
            on_forgets()
        else:
            self.apply_forgets()

    def apply_forgets(self) -> list[forgets.Forget]:
        """Drop what the forgets recorded since the last look cover, in RAM and on disk, and
        have the disk thread say so in the directory once it has deleted them; returns the
        ones of this store's model (the engine forgets them in its slots too)."""
        if self._forgets is None:
            return []
        recorded = forgets.read(self._forgets.path.parent, after=self._forgets_seen)
        if not recorded:
            return []
        mine = [f for f in recorded if f.concerns(self._model_key)]
        with self._lock:
            gone = [e for e in self._entries.values()
                    if any(f.covers(self._model_key, e.partition) for f in mine)]  # fmt: skip
            for entry in gone:
                self._remove(entry)
            self.counts["forgotten"] += len(gone)
            self._forgets_seen = max(self._forgets_seen, recorded[-1].seq)
            if self.disk is not None:
                self.disk.acknowledge(self._forgets_seen)
            self._lock.notify_all()
        return mine

    def close(self) -> None:
        self._closed = True
        if self.disk is not None:
            self.disk.close()

    # --- bookkeeping -------------------------------------------------------------------------

    def _add_ram(self, n: int) -> None:
        self.ram_used += n
        self.ram_peak = max(self.ram_peak, self.ram_used)

    def _drop_data(self, entry: KvEntry) -> None:
        if entry.data is not None:
            entry.data = None
            self.ram_used -= entry.n_bytes

    def _remove(self, entry: KvEntry) -> None:
        """(Under the lock.) Forget an entry in every tier. A disk job in flight for it sees
        `dropped`, and the deletion queued behind it removes whatever it wrote."""
        if self._entries.pop(entry.id, None) is None:
            return
        entry.dropped = True
        self._drop_data(entry)
        if entry.on_disk or entry.pending == "write":
            entry.on_disk = False
            self.disk_used -= entry.n_bytes
            if self.disk is not None:
                self.disk.delete(entry)

    # --- readings ----------------------------------------------------------------------------

    def held(self) -> list[KvEntry]:
        with self._lock:
            return list(self._entries.values())

    def conversations(self, limit: int) -> list[str]:
        """The conversations held in either tier, most recently used first (the announcement)."""
        with self._lock:
            ordered = sorted(self._entries.values(), key=lambda e: -e.last_used)
        seen: dict[str, None] = {}
        for entry in ordered:
            if entry.cache_key and entry.cache_key not in seen:
                seen[entry.cache_key] = None
                if len(seen) >= limit:
                    break
        return list(seen)

    def stats(self) -> dict:
        with self._lock:
            in_ram = sum(1 for e in self._entries.values() if e.data is not None)
            on_disk = sum(1 for e in self._entries.values() if e.on_disk)
            return {
                "ram": {"bytes": self.ram_used, "bound": self.ram_bound, "entries": in_ram,
                        "peak": self.ram_peak},
                "disk": {"bytes": self.disk_used, "entries": on_disk,
                         "bound": self.disk.budget if self.disk is not None else 0,
                         "enabled": self.disk is not None},
                **self.counts,
            }  # fmt: skip
