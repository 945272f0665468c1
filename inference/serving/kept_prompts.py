"""Forgetting kept prompts (inference.engine.tiers) on this box, whether their model is loaded
or not: a loaded model's runner drops its own (it holds their directory), and the files of
models that are not loaded are deleted here.

    forget(host, directory, partition="apikey:3")        # an app's key was deleted
    forget(host, directory, model=spec, everything=True)  # a model's "Forget cached prompts",
                                                          # or the model deleted

`directory` is the worker's own (inference.serving.hosting.prompt_cache_config). Both modes
call this where the runners are: the embedded client in the web process, each inference
worker for a "forget" control command in split mode.
"""

import logging
import os
from dataclasses import dataclass
from pathlib import Path

from inference.engine.host import EngineHost, ModelSpec
from inference.engine.tiers import files, forgets
from inference.engine.tiers.config import FLUSH_S
from inference.engine.tiers.entries import model_key

log = logging.getLogger(__name__)


@dataclass(slots=True, frozen=True)
class Forgotten:
    loaded: int  # entries the loaded runners dropped
    on_disk: int  # entry files deleted here

    @property
    def total(self) -> int:
        return self.loaded + self.on_disk


def forget(
    host: EngineHost, directory: str | Path, *, partition: str | None = None,
    model: ModelSpec | None = None, everything: bool = False,
) -> Forgotten:  # fmt: skip
    """A partition's kept prompts, or with `everything` all of them, of `model` or of every
    model. Recorded first (tiers.forgets), so that whoever holds them does it whatever it is
    doing: a runner loaded (told here too, its slots with its tiers), starting, stopping, or
    taking a directory over; then the directories nobody holds are done here, and the others
    waited for, up to the flush's own bound."""
    if partition is None and not everything:
        raise ValueError("forget a partition's kept prompts, or everything")
    keys = model_keys(model) if model is not None else ()
    record = forgets.record(Path(directory), partition=None if everything else partition,
                            models=keys, everything=everything)  # fmt: skip
    loaded = host.forget_prompts(partition, everything=everything,
                                 name=model.name if model else None)  # fmt: skip
    on_disk = files.forget(Path(directory), record, wait_s=FLUSH_S)
    if loaded or on_disk:
        log.info("forgot %d kept prompts%s%s", loaded + on_disk,
                 f" of {model.name}" if model else "",
                 f" of {partition}" if partition and not everything else "")  # fmt: skip
    return Forgotten(loaded, on_disk)


def model_keys(model: ModelSpec) -> tuple[str, ...]:
    """The directories a model's kept prompts may be in: by its file's digest, and by its path
    (a runner loaded before the digest was known names its directory so)."""
    path = getattr(model.config, "model_path", "")
    keys = {model_key(f"file:{os.path.abspath(path)}")} if path else set()
    if model.sha256:
        keys.add(model_key(model.sha256))
    return tuple(sorted(keys))
