"""The model files of this box by content (split mode's inference worker): every GGUF under
MODELS_DIR and the packaged ones (the starter model), each hashed once and remembered by
(path, size, mtime), so a box finds a request's model by its sha256 wherever its own copy lies.
Boxes need not share a path, nor hold every model.

The digests survive restarts in DATA_DIR/model-index.json; a file whose size or mtime changed
is hashed again. Hashing runs on the caller's thread (the worker's announcer thread keeps the
index fresh; a request for a digest not found looks once more, so a file copied in a moment ago
is found without waiting for the next pass).
"""

import hashlib
import json
import logging
import os
import threading
from pathlib import Path

from inference.serving.announcement import ServedModel

log = logging.getLogger(__name__)

CHUNK_BYTES = 1 << 20


class ModelIndex:
    def __init__(self, roots: list[Path], files: list[Path] = (), cache_file: Path | None = None):
        self.roots = [Path(root) for root in roots]
        self.files = [Path(path) for path in files]
        self.cache_file = cache_file
        # path -> (size, mtime_ns, sha256); replaced whole, so readers need no lock. Until the
        # first refresh, the saved digests of files that are still as they were.
        self._known: dict[str, tuple[int, int, str]] = {
            path: entry for path, entry in self._read_cache().items() if _stat(path) == entry[:2]
        }
        self._by_sha: dict[str, str] = {}
        self._refreshing = threading.Lock()
        self._sync()

    # --- readings --------------------------------------------------------------------------------

    def path_for(self, sha256: str) -> str | None:
        """This box's file with this content, if it has one (as of the last refresh)."""
        return self._by_sha.get(sha256)

    def served(self) -> tuple[ServedModel, ...]:
        return tuple(
            ServedModel(sha, self._known[path][0]) for sha, path in sorted(self._by_sha.items())
        )

    # --- refreshing ------------------------------------------------------------------------------

    def refresh(self) -> None:
        """Look at the files again: hash the new or changed ones, forget the removed ones."""
        with self._refreshing:
            found = self._candidates()
            known = {}
            for path, (size, mtime) in found.items():
                entry = self._known.get(path)
                if entry is not None and entry[:2] == (size, mtime):
                    known[path] = entry
                    continue
                try:
                    known[path] = (size, mtime, _sha256(path))
                except OSError as exc:  # removed or unreadable meanwhile
                    log.warning("cannot hash %s: %s", path, exc)
                    continue
                log.info("indexed %s (sha256 %s)", path, known[path][2][:12])
            changed = known != self._known
            self._known = known
            self._sync()
            if changed:
                self._write_cache()

    def add(self, path: str | Path, sha256: str) -> None:
        """A file whose digest the caller computed as it wrote it (a model copied from the web
        box, inference.serving.copy_worker): known at once, without hashing it again."""
        with self._refreshing:
            resolved = str(Path(path).resolve())
            stat = _stat(resolved)
            if stat is None:
                return
            self._known = {**self._known, resolved: (*stat, sha256)}
            self._sync()
            self._write_cache()

    def _candidates(self) -> dict[str, tuple[int, int]]:
        """path -> (size, mtime_ns) of every GGUF file to index."""
        paths = [p for root in self.roots if root.is_dir() for p in _ggufs(root)]
        found = {}
        for path in [*paths, *self.files]:
            if (stat := _stat(path)) is not None:
                found[str(path.resolve())] = stat
        return found

    def _sync(self) -> None:
        by_sha: dict[str, str] = {}
        for path, (_, _, sha) in sorted(self._known.items()):
            by_sha.setdefault(sha, path)  # two copies of one file: either serves
        self._by_sha = by_sha

    def _read_cache(self) -> dict[str, tuple[int, int, str]]:
        if self.cache_file is None:
            return {}
        try:
            raw = json.loads(self.cache_file.read_text())
            return {str(p): (int(v[0]), int(v[1]), str(v[2])) for p, v in raw.items()}
        except (OSError, ValueError, TypeError, IndexError, AttributeError):
            return {}  # none yet, or unreadable: everything is hashed again

    def _write_cache(self) -> None:
        if self.cache_file is None:
            return
        partial = self.cache_file.with_suffix(".part")
        try:
            partial.write_text(json.dumps(self._known))
            os.replace(partial, self.cache_file)
        except OSError as exc:
            log.warning("cannot save the model index: %s", exc)


def _ggufs(root: Path) -> list[Path]:
    """GGUF files under `root`, leaving out hidden ones (partial downloads and uploads)."""
    found = []
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if not d.startswith(".")]
        found.extend(
            Path(directory) / n for n in names if n.endswith(".gguf") and not n.startswith(".")
        )
    return found


def _stat(path: str | Path) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_size, stat.st_mtime_ns


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, hashlib.sha256).hexdigest()
