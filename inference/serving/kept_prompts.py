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
from inference.engine.tiers import files
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
    model; the runners first, so a runner that stops meanwhile has written nothing new."""
    if partition is None and not everything:
        raise ValueError("forget a partition's kept prompts, or everything")
    loaded = host.forget_prompts(partition, everything=everything,
                                 name=model.name if model else None)  # fmt: skip
    key = None
    if model is not None:
        key = model_key(model.sha256 or f"file:{os.path.abspath(model.config.model_path)}")
    # A runner unloaded a moment ago may still be writing its RAM tier: waited for, up to the
    # flush's own bound, so what it writes is forgotten too.
    on_disk = files.forget(Path(directory), model_key=key, partition=partition,
                           everything=everything, wait_s=FLUSH_S)  # fmt: skip
    if loaded or on_disk:
        log.info("forgot %d kept prompts%s%s", loaded + on_disk,
                 f" of {model.name}" if model else "",
                 f" of {partition}" if partition and not everything else "")  # fmt: skip
    return Forgotten(loaded, on_disk)
