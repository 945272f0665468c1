"""Forgets of kept prompts, written down before they are done, so that none can be outrun.

A forget (a partition's kept prompts, or everything of some models) is first appended to its
worker's log, `<worker dir>/.forgotten`, one JSON line with a number one higher than the last
(`record`). Each layout directory says up to which number its entries have been forgotten
(`applied`, in `<layout dir>/.forgets-applied`; none: 0). The rule: a record applies to every
entry of its models and partition in a directory that has not applied it, and to every entry
a store holds in RAM that it made before it applied it. Then whoever holds a directory's
entries does the forget, whenever it is written:

1. a store that opens a directory deletes what the records it has not applied cover
   (disk.DiskTier.open), before it indexes anything: files a killed runner never deleted, or a
   runner that stopped after the forget wrote;
2. a store that serves applies new records between steps (its disk thread looks at the log
   while idle; the engine drops them from its slots too), then says so in its directory;
3. a store that stops applies them before it writes its RAM tier to disk, and while it writes;
4. files.forget does it under the lock for the directories nobody holds, and waits for the
   holders of the others to say they have (or to let go: then it does it itself).

So the answer to a forget never depends on who holds a directory at that moment, a kill never
brings back what was forgotten, and a box that was off does it when it opens its directories.
"""

import fcntl
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

LOG_NAME = ".forgotten"
APPLIED_NAME = ".forgets-applied"
MAX_PARTITION = 256


@dataclass(slots=True, frozen=True)
class Forget:
    """One recorded forget: `partition`'s entries (everything: all of them) of `models` (model
    keys, entries.model_key; empty: every model)."""

    seq: int
    partition: str | None
    models: tuple[str, ...] = ()
    everything: bool = False

    def __post_init__(self):
        if not self.everything and self.partition is None:
            raise ValueError("forget a partition's kept prompts, or everything")
        if self.partition is not None and not 0 < len(self.partition) <= MAX_PARTITION:
            raise ValueError("a partition is a short string")

    def concerns(self, model_key: str) -> bool:
        return not self.models or model_key in self.models

    def covers(self, model_key: str, partition: str | None) -> bool:
        """Whether an entry of this model and partition is forgotten."""
        return self.concerns(model_key) and (self.everything or partition == self.partition)

    def as_json(self) -> str:
        return json.dumps({"seq": self.seq, "partition": self.partition,
                           "models": list(self.models), "everything": self.everything})  # fmt: skip


def record(worker_dir: Path, *, partition: str | None = None, models=(),
           everything: bool = False) -> Forget:  # fmt: skip
    """Append a forget to the worker's log (on disk before this returns) and return it."""
    Forget(0, partition, tuple(models), everything)  # checked before anything is written
    worker_dir = Path(worker_dir)
    worker_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    with _locked_log(worker_dir) as handle:
        handle.seek(0)
        latest = _last_seq(_parse(handle.read()))
        forget = Forget(latest + 1, partition, tuple(sorted(set(models))), everything)
        handle.seek(0, os.SEEK_END)
        handle.write((forget.as_json() + "\n").encode())
        handle.flush()
        os.fsync(handle.fileno())
    _sync_directory(worker_dir)  # a log just made is there after a power cut too
    return forget


def read(worker_dir: Path, after: int = 0) -> list[Forget]:
    """The recorded forgets numbered above `after`, in order."""
    try:
        text = (Path(worker_dir) / LOG_NAME).read_bytes()
    except FileNotFoundError:
        return []
    return [forget for forget in _parse(text) if forget.seq > after]


def last(worker_dir: Path) -> int:
    """The number of the latest recorded forget (0: none)."""
    return _last_seq(read(worker_dir))


def compact(worker_dir: Path, upto: int) -> None:
    """Drop the records up to `upto` that every directory has applied, keeping the latest one
    (its number is where the next one counts from)."""
    with _locked_log(Path(worker_dir)) as handle:
        handle.seek(0)
        kept = _parse(handle.read())
        if not kept:
            return
        kept = [f for f in kept if f.seq > upto] or kept[-1:]
        temporary = Path(worker_dir) / (LOG_NAME + ".new")
        temporary.write_bytes("".join(f.as_json() + "\n" for f in kept).encode())
        os.replace(temporary, Path(worker_dir) / LOG_NAME)


def applied(directory: Path) -> int:
    """Up to which forget a layout directory's entries are forgotten (0: none said)."""
    try:
        return int((Path(directory) / APPLIED_NAME).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def mark_applied(directory: Path, seq: int) -> None:
    """Say that a directory's entries are forgotten up to `seq` (by its lock's holder only)."""
    temporary = Path(directory) / (APPLIED_NAME + ".new")
    try:
        temporary.write_text(str(seq))
        os.replace(temporary, Path(directory) / APPLIED_NAME)
    except FileNotFoundError:  # the directory was forgotten whole meanwhile
        pass
    except OSError as exc:  # it is applied again at the next open: nothing is kept for it
        log.warning("could not mark %s forgotten up to %d: %s", directory, seq, exc)


class Watch:
    """The latest record's number, read again only when the log changes (a stat while idle)."""

    def __init__(self, worker_dir: Path):
        self.path = Path(worker_dir) / LOG_NAME
        self._seen: tuple | None = None
        self.latest = 0

    def look(self) -> int:
        try:
            stat = self.path.stat()
            signature = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
        except FileNotFoundError:
            signature = None
        if signature != self._seen:
            self._seen = signature
            self.latest = last(self.path.parent)
        return self.latest


class _locked_log:
    """The log file under an exclusive lock (writers one at a time; readers read it whole, and
    a compaction replaces it whole)."""

    def __init__(self, worker_dir: Path):
        self.path = worker_dir / LOG_NAME

    def __enter__(self):
        while True:
            descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            self.handle = os.fdopen(descriptor, "r+b")
            try:
                fcntl.flock(self.handle, fcntl.LOCK_EX)
                # A compaction may have put a new log in its place meanwhile: lock that one.
                if os.fstat(descriptor).st_ino == os.stat(self.path).st_ino:
                    return self.handle
            except FileNotFoundError:
                pass
            except OSError:
                self.handle.close()
                raise
            self.handle.close()

    def __exit__(self, *exc) -> None:
        self.handle.close()


def _sync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def _parse(text: bytes) -> list[Forget]:
    """The records of a log; a line that is not one (a write cut short by a kill: its forget
    never answered) is skipped."""
    forgets = []
    for line in text.splitlines():
        try:
            fields = json.loads(line)
            models = fields.get("models") or []
            if not isinstance(models, list) or not all(isinstance(m, str) for m in models):
                continue
            if type(fields.get("seq")) is not int:
                continue
            forgets.append(Forget(fields["seq"], fields.get("partition"), tuple(models),
                                  fields.get("everything") is True))  # fmt: skip
        except (ValueError, TypeError, AttributeError):
            continue
    return forgets


def _last_seq(forgets: list[Forget]) -> int:
    return max((f.seq for f in forgets), default=0)
