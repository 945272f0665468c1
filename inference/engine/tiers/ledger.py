"""The disk bound of a tree of kept prompts, held at every moment by all its runners together.

The tree `<root>/<worker>/<model key>/<layout>/` (`$APPLIANCE_DATA_DIR/kv-cache/`) holds the kept
prompts of every model and every worker of the box that share its data directory, on a disk
that also holds the database and the models. What its layout directories take is written in
one small file, `<root>/.usage` (JSON: directory -> bytes), read and changed only under an
exclusive lock on `<root>/.usage.lock`, by the disk thread of each runner (DiskTier):

1. A write reserves its file's size first (`reserve`). When the tree would pass the bound, the
   oldest files of directories no runner holds go (models not loaded, other load settings of
   this one; `.tmp` leftovers first); when that is not enough, the write is refused (the entry
   is dropped, as when the disk is full). A runner's own directory is its store's to trim.
2. Once written, or after a deletion, the runner says what its directory holds (`settle`).
   Bytes on disk are never more than the file says: a reservation comes before the write, a
   deletion before its release.
3. The runners alive (each holds its directory's lock) share the bound: each may hold what the
   others leave, and at least its fair share (the bound over the runners alive). A runner
   refused a write below its fair share says it wants it, and the others' shares shrink to
   leave it. `share` is read at each change and every second; a runner above it trims its own
   least recently used entries (PromptStore). So a runner that never writes (an embedding
   model's) takes nothing from the others, one that opens beside a full one gets its half, and
   the whole bound once the other has stopped, flushing included.
4. What a directory no runner holds takes is counted from its files at each open and before
   evicting from it (a runner killed mid-write, files deleted by a forget), and its `.tmp`
   leftovers are swept then. A missing or unreadable ledger is counted again the same way.

A directory this process cannot use (another user's) is logged, counted when it can be read,
and otherwise left alone.
"""

import contextlib
import errno
import fcntl
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from inference.engine.tiers import files

log = logging.getLogger(__name__)

LEDGER, LEDGER_LOCK = ".usage", ".usage.lock"
# The lock is held for a read, a write and a few probes; a holder stuck past this (stopped by a
# debugger) costs the others a refused write, not a hang.
LOCK_WAIT_S = 10.0


@dataclass(slots=True)
class Tree:
    """The ledger as read under the lock, with who is alive now."""

    bytes: dict[str, int]  # directory ("<model key>/<layout>") -> what it takes on the disk
    wanting: set[str]  # runners refused a write below their fair share (3.)
    alive: dict[str, bool | None] = field(default_factory=dict)  # None: unusable here

    @property
    def total(self) -> int:
        return sum(self.bytes.values())


class Ledger:
    """One runner's side of the tree's accounting: its directory's bytes, its share."""

    def __init__(self, root: Path, directory: Path, bound: int):
        self.root = Path(root)
        self.name = Path(directory).relative_to(self.root).as_posix()
        self._depth = len(Path(self.name).parts)  # where layout directories are in the tree
        self.bound = bound
        self.share = bound  # what this runner's directory may hold now (3.)
        self._foreign: set[str] = set()  # directories already logged as unusable

    def open(self, held: int) -> None:
        """Count the directories no runner holds again, sweeping their leftovers (4.); add this
        one's `held` bytes; make room under the bound among the idle ones; read the share."""
        with self._tree() as tree:
            for name, live in tree.alive.items():
                if live is False:
                    tree.bytes[name] = self._count(name, sweep=True)
            tree.bytes[self.name] = held
            tree.wanting.discard(self.name)
            self._fit(tree)

    def reserve(self, held: int, n: int) -> bool:
        """Room for a file of `n` bytes beside this directory's `held` (1.); False when the
        tree has none even after the idle directories' oldest files went. Refused below its
        fair share, this runner says it wants that share: the others trim to leave it (3.)."""
        with self._tree() as tree:
            tree.bytes[self.name] = held + n
            self._fit(tree)
            if tree.total <= self.bound:
                return True
            tree.bytes[self.name] = held
            if held + n <= self._fair(tree):
                tree.wanting.add(self.name)
            return False

    def settle(self, held: int) -> None:
        """This directory holds `held` bytes now (2.), and reads its share again."""
        with self._tree() as tree:
            tree.bytes[self.name] = held

    def refresh(self) -> int:
        """The share now (runners have opened, stopped or asked for room meanwhile)."""
        with self._tree():
            pass
        return self.share

    def close(self, held: int) -> None:
        """This runner stops: its directory holds `held` bytes, and it wants no share."""
        with self._tree() as tree:
            tree.bytes[self.name] = held
            tree.wanting.discard(self.name)

    # --- under the lock ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _tree(self):
        """The ledger and, for every directory of the tree, whether a runner holds it; written
        back, and the share read, at the end."""
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        with tree_locked(self.root):
            tree = self._read()
            was = (dict(tree.bytes), set(tree.wanting))
            for directory in _directories(self.root, self._depth):
                name = directory.relative_to(self.root).as_posix()
                tree.alive[name] = True if name == self.name else self._probe(name, directory)
                if name not in tree.bytes:  # new to the ledger: a fresh tree, or unreadable
                    tree.bytes[name] = self._count(name)
            for gone in set(tree.bytes) - set(tree.alive):
                del tree.bytes[gone]
            tree.wanting &= {name for name, live in tree.alive.items() if live}
            yield tree
            if (tree.bytes, tree.wanting) != was:  # an idle runner's refresh writes nothing
                self._write(tree)
            self.share = self._share(tree)

    def _fair(self, tree: Tree) -> int:
        # At least this one's, but recount's directory may be gone (forgotten whole).
        return self.bound // max(1, sum(1 for live in tree.alive.values() if live))

    def _share(self, tree: Tree) -> int:
        """Its fair share at least; more where the other runners alive leave it, unless they
        want their fair share (3.)."""
        fair = self._fair(tree)
        others = [name for name, live in tree.alive.items() if live and name != self.name]
        taken = sum(max(tree.bytes.get(name, 0), fair if name in tree.wanting else 0)
                    for name in others)  # fmt: skip
        return max(fair, self.bound - taken)

    def _fit(self, tree: Tree) -> None:
        """The oldest files of idle directories go until the tree is within the bound."""
        if tree.total <= self.bound:
            return
        idle = [name for name, live in tree.alive.items()
                if live is False and tree.bytes.get(name)]  # fmt: skip
        candidates = []
        for name in idle:
            found = list(files.stored(self.root / name))
            tree.bytes[name] = sum(size for _, size, _ in found)  # counted again: exact
            # Leftovers of a killed write first, then the oldest entries.
            candidates += [(path.suffix != files.TEMPORARY, mtime, size, path, name)
                           for mtime, size, path in found]  # fmt: skip
        excess = tree.total - self.bound
        for _, _, size, path, name in sorted(candidates):
            if excess <= 0:
                break
            try:
                path.unlink(missing_ok=True)
            except OSError as exc:
                self._unusable(name, exc)
                continue
            tree.bytes[name] -= size
            excess -= size

    def _count(self, name: str, *, sweep: bool = False) -> int:
        """What an idle directory takes on the disk, its `.tmp` leftovers removed first with
        `sweep` (no runner is writing them)."""
        total = 0
        for _, size, path in files.stored(self.root / name):
            if sweep and path.suffix == files.TEMPORARY:
                try:
                    path.unlink(missing_ok=True)
                    continue
                except OSError as exc:
                    self._unusable(name, exc)
            total += size
        return total

    def _probe(self, name: str, directory: Path) -> bool | None:
        try:
            return files.is_locked(directory)
        except OSError as exc:
            self._unusable(name, exc)
            return None

    def _unusable(self, name: str, exc: OSError) -> None:
        if name not in self._foreign:
            self._foreign.add(name)
            log.warning("kept prompts: %s under %s is not this appliance's to use, left alone "
                        "(%s)", name, self.root, exc)  # fmt: skip

    def _read(self) -> Tree:
        try:
            raw = json.loads((self.root / LEDGER).read_text())
        except FileNotFoundError:
            raw = {}
        except (OSError, ValueError) as exc:
            log.warning("kept prompts: the disk ledger %s is unreadable (%s); counting again",
                        self.root / LEDGER, exc)  # fmt: skip
            raw = {}
        raw = raw if isinstance(raw, dict) else {}
        sizes = raw.get("bytes") if isinstance(raw.get("bytes"), dict) else {}
        wanting = raw.get("wanting") if isinstance(raw.get("wanting"), list) else []
        return Tree({k: v for k, v in sizes.items() if type(v) is int and v >= 0},
                    {name for name in wanting if isinstance(name, str)})  # fmt: skip

    def _write(self, tree: Tree) -> None:
        temporary = self.root / (LEDGER + ".new")
        temporary.write_text(json.dumps({"bytes": tree.bytes, "wanting": sorted(tree.wanting)},
                                        sort_keys=True))  # fmt: skip
        os.replace(temporary, self.root / LEDGER)


def recount(directory: Path) -> None:
    """(Under the directory's lock, which the caller holds: no runner writes it.) Its files
    were deleted outside any runner (files.forget): the ledger of its tree, where it has one,
    counts it again now (or drops it, gone), so the runners alive get the room back at once
    rather than at the next open (4.)."""
    directory = Path(directory)
    # The tree's root: the box's (<root>/<worker>/<model key>/<layout>) or a worker's alone.
    for root in directory.parents[1:3]:
        if (root / LEDGER).exists():
            ledger = Ledger(root, directory, 0)
            with ledger._tree() as tree:
                if directory.is_dir():
                    tree.bytes[ledger.name] = ledger._count(ledger.name)
            return


def _directories(root: Path, depth: int) -> list[Path]:
    """Every layout directory of the tree, `depth` levels down ([<worker>/]<model key>/<layout>)."""
    found = [root]
    for _ in range(depth):
        found = [sub for path in found for sub in _subdirectories(path)]
    return found


def _subdirectories(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir() and not p.name.startswith(".")]
    except (FileNotFoundError, NotADirectoryError, PermissionError):
        return []


@contextlib.contextmanager
def tree_locked(root: Path):
    """The tree's lock: while it is held, nothing is reserved, so what the tree's files take is
    at most what the ledger says (a file is only ever written within a reservation)."""
    path = Path(root) / LEDGER_LOCK
    with open(path, "a+b") as handle:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise
            if time.monotonic() >= deadline:
                raise OSError(errno.ETIMEDOUT, f"{path} was held for {LOCK_WAIT_S:.0f} s")
            time.sleep(0.002)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
