"""The RAM and disk tiers of kept prompts: what they hold, within their bounds.

1. `reserve()` takes room in RAM for a state about to be saved, before llama.cpp copies it, and
   `put()` keeps the saved sequence there. An entry that a kept one already covers (its tokens
   a prefix of the kept one's, in the same partition) is not kept twice; kept entries that the
   new one covers go. Neither ever waits (they run on the engine thread, inside a step): room
   comes from the least recently used entries, those already on disk leaving at once, others
   starting their way to disk (to the disk tier when it has room, its own least recently used
   entries going first, else dropped); a save that finds no room now is not kept. So that room
   is there when wanted, the least recently used half of RAM is written ahead, staying in RAM.
2. `lookup()` finds the entry sharing the longest prefix with a prompt, in that prompt's
   partition only (another partition's entry is never a candidate, even for the same text),
   through a prefix index (index.py), never by comparing the prompt with every entry. An entry
   larger than the whole RAM tier (kept with a larger bound) is no candidate: it could only be
   read into RAM by passing the bound, so it stays on disk for a runner that has the room.
3. `fetch()` has the disk thread read an entry back into RAM for a restore; the request waits
   (the engine is woken when it arrives, or when it cannot come, `on_fetched`). The read takes
   its room in RAM before it allocates anything (behind the writes that free it, at most
   twice), or does not happen; a failed read drops the entry.
4. `forget()` drops a partition's entries or all of them; `flush()` writes what RAM holds to
   disk before the runner stops, most recently used first. Forgets recorded in the worker's log
   (tiers.forgets) are applied by `apply_forgets()`: by the engine between steps when the disk
   thread sees a new one (`on_forgets`), by the disk thread itself when no engine serves (before
   it starts, after it stopped), and by `flush()` before it writes anything. A partition's
   encoded images on disk go with its entries.
5. `read_image()` and `write_image()` are the image encoder's way to the disk tier's images
   (DiskTier.read_image), whichever disk tier the store has now (one taken over late included).

The RAM bound holds for what this process holds, not just for what the index says: `ram_used`
counts the states in RAM, those being written (until written, and a dropped entry's until its
write job lets go of it), and the room reserved for a save being copied or a read under way.
And it holds for the worker's runners together: a runner that opens while a stopped one still
writes its RAM tier to disk keeps nothing in RAM until that one lets go (`open`).

Called from the engine thread, and from the disk thread with its results, under one lock.
"""

import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from inference.engine.tiers import forgets
from inference.engine.tiers.disk import DiskResult, DiskTier
from inference.engine.tiers.entries import KvEntry, as_tokens
from inference.engine.tiers.index import PrefixIndex

log = logging.getLogger(__name__)

# Shorter sequences are not kept: a restore saves less than its bookkeeping costs.
MIN_TOKENS = 16
# The share of the RAM bound that may hold entries not yet on disk: the rest of them is written
# ahead, so that room for a save is an entry's state let go of, never a wait for a write.
UNWRITTEN_SHARE = 0.5
# A read that finds RAM full of writes on their way out is queued again behind them this often.
MAX_REREADS = 2
# A directory a stopped runner still writes to is taken over within this (config.FLUSH_S).
TAKEOVER_S, TAKEOVER_POLL_S = 30.0, 0.2


@dataclass(slots=True, frozen=True)
class Hit:
    entry: KvEntry
    shared: int  # leading prompt tokens it holds
    data: bytearray | None = None  # its state when it was found in RAM (None: on disk)


class PromptStore:
    def __init__(
        self, ram_bytes: int, disk: DiskTier | None = None, *, min_tokens: int = MIN_TOKENS
    ):
        if ram_bytes < 0:
            raise ValueError("the RAM tier's bound is a number of bytes")
        self.ram_bound = ram_bytes
        # What RAM may hold now: the bound, or 0 while a stopped runner's tier still holds its
        # share beside this one (it writes it to disk: `open`).
        self._room_bound = ram_bytes
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
        self.ram_used = 0  # bytes held or promised (module doc)
        self.disk_used = 0
        self.ram_peak = 0
        self.counts = {"saved": 0, "spilled": 0, "dropped": 0, "fetched": 0, "unreadable": 0,
                       "spill_failed": 0, "forgotten": 0, "no_room": 0}  # fmt: skip
        # Every entry, and those in RAM, on disk (or being written) and in RAM only (not being
        # written): each least recently used first.
        self._entries: OrderedDict[str, KvEntry] = OrderedDict()
        self._ram: OrderedDict[str, KvEntry] = OrderedDict()
        self._disk: OrderedDict[str, KvEntry] = OrderedDict()
        self._unwritten: OrderedDict[str, KvEntry] = OrderedDict()
        self._unwritten_bytes = 0
        self._leaving_bytes = 0  # of states being written that leave RAM once written
        self._on_disk = 0  # entries written (the readings' count, without a scan)
        self._index = PrefixIndex()  # the entries that fit in RAM, by their tokens
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
        if disk.others_flushing():
            self._room_bound = 0
            threading.Thread(target=self._wait_for_flushes, args=(disk, takeover_s),
                             name="kv-flushes", daemon=True).start()  # fmt: skip
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

    def _wait_for_flushes(self, disk: DiskTier, within: float) -> None:
        """The RAM bound holds for the box while a stopped runner writes its tier to disk:
        this tier keeps nothing until that runner lets go (within `within`, its flush's
        limit), then takes its share."""
        log.info("kept prompts: RAM tier empty until a stopped runner has written its own")
        deadline = time.monotonic() + within
        while time.monotonic() < deadline and not self._closed and disk.others_flushing():
            time.sleep(TAKEOVER_POLL_S)
        with self._lock:
            self._room_bound = self.ram_bound

    def _attach(self, disk: DiskTier, found: list[KvEntry]) -> None:
        disk.notify = self._disk_done
        disk.admit_read = self._admit_read
        disk.shrunk = self._fit_disk
        disk.on_idle = self._look_for_forgets  # what RAM holds from before is applied there
        too_large = 0
        with self._lock:
            for entry in found:
                self._entries[entry.id] = entry
                self._disk[entry.id] = entry
                self._touch(entry)
                self.disk_used += entry.n_bytes
                self._on_disk += 1
                if entry.n_bytes <= self.ram_bound:
                    self._index.add(entry)
                else:
                    too_large += 1
            self.disk = disk
            self._trim_disk(0)
            # The directory is forgotten as far as what this store holds is (RAM, from before
            # a takeover, may be behind the files): no further.
            disk.acknowledge(self._forgets_seen)
        log.info("kept prompts: %d entries (%d MiB) on disk for this model%s",
                 len(found), self.disk_used >> 20,
                 f"; {too_large} larger than the RAM tier stay there unused" if too_large
                 else "")  # fmt: skip
        self._look_for_forgets()

    def _fit_disk(self) -> None:
        """(The disk thread.) The disk's share shrank (a runner opened beside this one): the
        least recently used entries leave the disk until it fits."""
        with self._lock:
            self._trim_disk(0)

    @property
    def enabled(self) -> bool:
        return self.ram_bound > 0

    # --- 2. lookup ---------------------------------------------------------------------------

    def lookup(
        self, partition: str | None, prompt: np.ndarray, at_least: int = 1,
        min_fraction: float = 0.0, *, in_ram_only: bool = False,
    ) -> Hit | None:  # fmt: skip
        """The entry of `partition` sharing the longest prefix with `prompt` (at least
        `at_least` tokens, and at least `min_fraction` of the entry's); of equal ones, the one
        in RAM (`in_ram_only`: only those). Its state comes with it, taken under the lock: the
        disk thread may let go of it the moment after."""
        with self._lock:
            found = self._index.best(partition, prompt, at_least, min_fraction, in_ram_only)
            if found is None:
                return None
            entry, shared = found
            return Hit(entry, shared, entry.data)

    def discard(self, entry: KvEntry) -> None:
        """Drop an entry llama.cpp refused to restore."""
        with self._lock:
            self._remove(entry)
            self.counts["unreadable"] += 1

    def touch(self, entry: KvEntry) -> None:
        with self._lock:
            self._touch(entry)
            entry.restores += 1

    # --- 1. reserve and put ------------------------------------------------------------------

    def covers(self, partition: str | None, tokens) -> bool:
        """Whether a kept entry already holds these tokens (or more): saving them is waste."""
        ids = as_tokens(tokens)
        with self._lock:
            return self._index.covering(partition, ids) is not None

    def reserve(self, n: int, wait: float = 0.0) -> bool:
        """Take room for a state of n bytes about to be saved (then `put` it, or `release` the
        room); False when RAM has no room for it now (it is not saved). `wait`: how long it
        may wait for writes to free it (only off the engine's steps: a runner stopping)."""
        deadline = time.monotonic() + wait
        with self._lock:
            while 0 < n <= self.ram_bound:
                if self._make_room(n):
                    self._add_ram(n)
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or not self._leaving_bytes:
                    break
                self._lock.wait(left)  # a write on its way out frees its bytes when done
            self.counts["dropped"] += 1
            log.debug("a kept prompt of %d bytes was dropped: no room in RAM now", n)
            return False

    def not_kept(self, n: int) -> None:
        """n sequences' KV was dropped unsaved (a save did not fit a person's step)."""
        with self._lock:
            self.counts["dropped"] += n

    def release(self, n: int) -> None:
        with self._lock:
            self.ram_used -= n

    def put(
        self, partition: str | None, cache_key: str | None, tokens, data: bytearray, *,
        reserved: int = 0,
    ) -> KvEntry | None:  # fmt: skip
        """Keep a saved sequence (module doc, 1.), in the room `reserved` for it if any; None
        when it is not kept."""
        ids = as_tokens(tokens)
        n = len(data)
        with self._lock:
            self.ram_used -= reserved  # the room becomes the entry's, or is let go
            if len(ids) < self.min_tokens or n == 0 or n > self.ram_bound:
                return None
            kept = self._index.covering(partition, ids)
            if kept is not None:  # already kept, whole
                self._touch(kept)
                return None
            for entry in self._index.covered(partition, ids):  # the new one holds them and more
                self._remove(entry)
            if not self._make_room(n):
                self.counts["dropped"] += 1
                log.debug("a kept prompt of %d bytes was dropped: no room in RAM now", n)
                return None
            entry = KvEntry(uuid.uuid4().hex, partition, cache_key, ids, n, data=data)
            self._entries[entry.id] = entry
            self._ram[entry.id] = entry
            self._unwritten[entry.id] = entry
            self._unwritten_bytes += n
            self._touch(entry)
            self._index.add(entry)
            self._add_ram(n)
            self.counts["saved"] += 1
            self._write_ahead()
            return entry

    def _make_room(self, n: int) -> bool:
        """(Under the lock.) Whether RAM has room for n more bytes now, after the least
        recently used entries left it as far as needed: those on disk let go of their state at
        once; others are written first (they free their bytes once written). Never waits."""
        short = self.ram_used + n - self._room_bound - self._leaving_bytes
        victims = []
        for entry in self._ram.values():
            if short <= 0:
                break
            if not entry.leaving and entry.pending != "read":
                victims.append(entry)
                short -= entry.n_bytes
        for entry in victims:
            self._leave_ram(entry)
        return self.ram_used + n <= self._room_bound

    def _leave_ram(self, entry: KvEntry) -> None:
        """(Under the lock.) Take an entry out of RAM: its state let go of when it is on disk,
        else once written (to disk when it has room), else the entry is gone."""
        if entry.on_disk and entry.pending is None:
            self._drop_data(entry)
        elif entry.pending == "write":
            self._set_leaving(entry)
        elif not entry.unwritable and self._spill(entry):
            self._set_leaving(entry)
        else:
            self._remove(entry)
            self.counts["dropped"] += 1

    def _spill(self, entry: KvEntry) -> bool:
        """(Under the lock.) Queue the write of an entry in RAM, when the disk has room."""
        if self.disk is None or not self._trim_disk(entry.n_bytes):
            return False
        entry.pending = "write"
        self.disk_used += entry.n_bytes
        self._disk[entry.id] = entry
        if self._unwritten.pop(entry.id, None) is not None:
            self._unwritten_bytes -= entry.n_bytes
        self.counts["spilled"] += 1
        self.disk.write(entry)
        return True

    def _write_ahead(self) -> None:
        """(Under the lock.) Write the least recently used entries that are in RAM only, while
        they pass their share of the bound (UNWRITTEN_SHARE), staying in RAM."""
        if self.disk is None:
            return
        while self._unwritten and self._unwritten_bytes > UNWRITTEN_SHARE * self.ram_bound:
            entry = next(iter(self._unwritten.values()))
            if not self._spill(entry):
                return

    def _trim_disk(self, n: int) -> bool:
        """(Under the lock.) Make the disk tier's room for n more bytes, least recently used
        entries out first (from disk only: one also in RAM stays there, in RAM only)."""
        if self.disk is None or n > self.disk.budget:
            return False
        while self.disk_used + n > self.disk.budget:
            victim = next((e for e in self._disk.values() if e.pending is None), None)
            if victim is None:
                return False
            if victim.data is not None:
                victim.on_disk = False
                self._on_disk -= 1
                victim.unwritable = True  # written again, it would only churn the disk
                del self._disk[victim.id]
                self.disk_used -= victim.n_bytes
                self.disk.delete(victim)
            else:
                self._remove(victim)
        return True

    # --- 3. fetch ----------------------------------------------------------------------------

    def fetch(self, entry: KvEntry) -> bool:
        """Have the disk thread read `entry` back; False when it cannot come (it is gone, or
        larger than RAM), and `on_fetched` is then not called for it."""
        with self._lock:
            if entry.dropped or entry.n_bytes > self.ram_bound:
                return False
            if entry.data is not None or entry.pending == "read":
                return True
            if self.disk is None or not entry.on_disk or entry.pending is not None:
                return False
            entry.pending = "read"
            entry.rereads = 0
        self.disk.read(entry)
        return True

    def _admit_read(self, entry: KvEntry) -> bool:
        """(The disk thread, before it reads an entry.) Take the read's room in RAM: True to
        read now. Else it is queued again behind the writes that free RAM (at most
        MAX_REREADS times) or given up, the engine told (`on_fetched`), nothing allocated."""
        with self._lock:
            if not entry.dropped and self._make_room(entry.n_bytes):
                self._add_ram(entry.n_bytes)
                return True
            if not entry.dropped and entry.rereads < MAX_REREADS and self._leaving_bytes:
                entry.rereads += 1
                self.disk.read(entry)
                return False
            entry.pending = None
            if not entry.dropped:
                self.counts["no_room"] += 1
        self.on_fetched(DiskResult("read", entry, False, 0.0, error="no room in RAM"))
        return False

    def _disk_done(self, result: DiskResult) -> None:
        """The disk thread's results (see DiskTier)."""
        entry = result.entry
        with self._lock:
            entry.pending = None
            if result.op == "write":
                self._written(entry, result.ok)
            elif entry.dropped:
                self.ram_used -= entry.n_bytes  # the room the read took
            elif not result.ok:
                self.ram_used -= entry.n_bytes
                self.counts["unreadable"] += 1
                self._remove(entry)
            else:
                entry.data = result.data  # in the room the read took (_admit_read)
                entry.read_seconds = result.seconds
                self._ram[entry.id] = entry
                self._touch(entry)  # wanted now: the last to leave RAM again
                self._index.changed(entry)
                self.counts["fetched"] += 1
            self._lock.notify_all()
        if result.op == "read":
            self.on_fetched(result)

    def _written(self, entry: KvEntry, ok: bool) -> None:
        """(Under the lock.) A write ended: the state leaves RAM if it was on its way out."""
        if entry.held:  # dropped while written: its job has let go of the state now
            entry.held = False
            self.ram_used -= entry.n_bytes
            if entry.leaving:
                entry.leaving = False
                self._leaving_bytes -= entry.n_bytes
        elif entry.dropped:
            pass  # _remove counted it out and queued the file's deletion
        elif ok:
            entry.on_disk = True
            self._on_disk += 1
            if entry.leaving:
                self._drop_data(entry)
        else:
            self.disk_used -= entry.n_bytes
            del self._disk[entry.id]
            self.counts["spill_failed"] += 1
            entry.unwritable = True
            if entry.leaving:
                self._remove(entry)

    # --- 4. forget and flush -----------------------------------------------------------------

    def forget(self, partition: str | None = None, *, everything: bool = False) -> int:
        """Drop a partition's entries (everything=True: all); returns how many."""
        with self._lock:
            gone = [e for e in self._entries.values()
                    if everything or e.partition == partition]  # fmt: skip
            for entry in gone:
                self._remove(entry)
            self.counts["forgotten"] += len(gone)
            if self.disk is not None:
                self.disk.forget_images(partition, everything=everything)
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
            written = 0
            for entry in reversed(list(self._ram.values())):
                # Each state leaves RAM once on disk: a stopped runner's tier shrinks as it
                # is written, beside the next runner's.
                if entry.pending is None and not entry.on_disk:
                    if entry.unwritable or not self._spill(entry):
                        continue
                    written += 1
                self._leave_ram(entry)
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
                for forget in mine:
                    self.disk.forget_images(forget.partition, everything=forget.everything)
                self.disk.acknowledge(self._forgets_seen)
            self._lock.notify_all()
        return mine

    # --- 5. encoded images -------------------------------------------------------------------

    def read_image(self, partition: str | None, key: str, rows: int,
                   cols: int) -> np.ndarray | None:  # fmt: skip
        disk = self.disk
        return None if disk is None else disk.read_image(partition, key, rows, cols)

    def write_image(self, partition: str | None, key: str, embeddings: np.ndarray) -> None:
        disk = self.disk
        if disk is not None:
            disk.write_image(partition, key, embeddings)

    def close(self) -> None:
        self._closed = True
        if self.disk is not None:
            self.disk.close()

    # --- bookkeeping (under the lock) --------------------------------------------------------

    def _touch(self, entry: KvEntry) -> None:
        self._clock += 1
        entry.last_used = self._clock
        for order in (self._entries, self._ram, self._disk, self._unwritten):
            if entry.id in order:
                order.move_to_end(entry.id)

    def _add_ram(self, n: int) -> None:
        self.ram_used += n
        self.ram_peak = max(self.ram_peak, self.ram_used)

    def _set_leaving(self, entry: KvEntry) -> None:
        if not entry.leaving:
            entry.leaving = True
            self._leaving_bytes += entry.n_bytes

    def _drop_data(self, entry: KvEntry) -> None:
        """The entry's state leaves RAM (it is on disk, or the entry is gone)."""
        if entry.data is None:
            return
        entry.data = None
        self.ram_used -= entry.n_bytes
        if entry.leaving:
            entry.leaving = False
            self._leaving_bytes -= entry.n_bytes
        del self._ram[entry.id]
        if self._unwritten.pop(entry.id, None) is not None:
            self._unwritten_bytes -= entry.n_bytes
        self._index.changed(entry)

    def _remove(self, entry: KvEntry) -> None:
        """Forget an entry in every tier. A disk job in flight for it sees `dropped`, and the
        deletion queued behind it removes whatever it wrote. A state being written stays
        counted until its write job lets go of it (`held`)."""
        if self._entries.pop(entry.id, None) is None:
            return
        entry.dropped = True
        self._index.remove(entry)
        if entry.pending == "write" and entry.data is not None:
            entry.held = True
            entry.data = None
            del self._ram[entry.id]
        else:
            self._drop_data(entry)
        if entry.on_disk or entry.pending == "write":
            self._on_disk -= entry.on_disk
            entry.on_disk = False
            self._disk.pop(entry.id, None)
            self.disk_used -= entry.n_bytes
            if self.disk is not None:
                self.disk.delete(entry)

    # --- readings ----------------------------------------------------------------------------

    def held(self) -> list[KvEntry]:
        with self._lock:
            return list(self._entries.values())

    def conversations(self, limit: int) -> list[str]:
        """The conversations held in either tier, most recently used first (the announcement)."""
        seen: dict[str, None] = {}
        with self._lock:
            for entry in reversed(self._entries.values()):
                if entry.cache_key and entry.cache_key not in seen:
                    seen[entry.cache_key] = None
                    if len(seen) >= limit:
                        break
        return list(seen)

    def stats(self) -> dict:
        with self._lock:
            on_disk = self._on_disk
            return {
                "ram": {"bytes": self.ram_used, "bound": self.ram_bound, "entries": len(self._ram),
                        "peak": self.ram_peak},
                "disk": {"bytes": self.disk_used, "entries": on_disk,
                         "bound": self.disk.budget if self.disk is not None else 0,
                         "enabled": self.disk is not None,
                         "note": self.disk.note if self.disk is not None else ""},
                **self.counts,
            }  # fmt: skip
