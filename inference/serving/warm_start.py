"""A restart comes back warm: the models loaded before a stop are loaded again at start.

The host calls `LoadedRecord.write` with what it holds after every load and every unload it
was asked for (keep-alive, an admin, the least recently used one making room), but not when
the process stops: then the record still names what was loaded, and `reload_previous` loads
those models again at the next start, in the background, one after the other, before a request
needs them (a request that comes first waits for its model's load as it would anyway). Their
kept prompts are on disk already (the runners wrote them when they stopped).
"""

import json
import logging
import os
import threading
from collections.abc import Callable
from pathlib import Path

from inference.engine.host import EngineHost, ModelSpec

log = logging.getLogger(__name__)


class LoadedRecord:
    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()

    def write(self, specs: list[ModelSpec]) -> None:
        data = json.dumps([spec.to_wire() for spec in specs])
        with self._lock:
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                temporary = self.path.with_suffix(".tmp")
                temporary.write_text(data)
                os.replace(temporary, self.path)
            except OSError as exc:
                log.warning("could not record the loaded models in %s: %s", self.path, exc)

    def read(self) -> list[ModelSpec]:
        """The specs recorded; none (with a log line) from a file that is not a record."""
        try:
            items = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as exc:
            log.warning("ignoring %s: %s", self.path, exc)
            return []
        specs = []
        for item in items if isinstance(items, list) else []:
            try:
                specs.append(ModelSpec.from_wire(item))
            except (TypeError, ValueError, KeyError) as exc:
                log.warning("ignoring a recorded model in %s: %s", self.path, exc)
        return specs


def reload_previous(
    host: EngineHost, record: LoadedRecord,
    resolve: Callable[[ModelSpec], ModelSpec] = lambda spec: spec,
) -> threading.Thread:  # fmt: skip
    """Load the recorded models again, in a background thread (returned, started). `resolve`:
    the spec with this box's own copy of the file (split mode's WorkerRuntime.local_spec)."""

    def load_all() -> None:
        for spec in record.read():
            try:
                host.load(resolve(spec))
                log.info("%s is loaded again, as it was before the restart", spec.name)
            except Exception as exc:  # noqa: BLE001 - it loads on its next request instead
                log.warning("%s was loaded before the restart but did not load now: %s",
                            spec.name, exc)  # fmt: skip

    thread = threading.Thread(target=load_all, name="reload-previous", daemon=True)
    thread.start()
    return thread
