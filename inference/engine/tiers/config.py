"""How a runner keeps prompts: its share of the bounds, its directory, its model's layout.

The bounds are the box's (PROMPT_CACHE_RAM, PROMPT_CACHE_DISK in the settings); "auto" sizes
them from the machine when the serving process starts: a quarter of the RAM available then, at
most 8 GiB, and a quarter of the data directory's free disk, at most 64 GiB. Each runner gets
the RAM bound divided by the models that may be loaded at once (its runner process holds its
RAM tier, so the sum of the runners' tiers holds the box's bound), and the whole disk bound,
which the runners alive share, each write reserved against one account of the tree (ledger).
"""

import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import psutil

from inference.engine.tiers.disk import IMAGE_SHARE, DiskTier
from inference.engine.tiers.entries import KvLayout
from inference.engine.tiers.store import PromptStore

log = logging.getLogger(__name__)

AUTO_RAM_SHARE, AUTO_RAM_MAX = 4, 8 << 30
AUTO_DISK_SHARE, AUTO_DISK_MAX = 4, 64 << 30
# How long a stopping runner may spend writing its RAM tier to disk, after its model is freed.
FLUSH_S = 30.0


@dataclass(slots=True, frozen=True)
class PromptCacheConfig:
    """Sent to a runner in its Launch (inference.serving.messages)."""

    directory: str  # this worker's kept prompts ("" : no disk tier)
    ram_bytes: int  # this runner's share of the RAM bound (0: warm memory off)
    disk_bytes: int  # the box's disk bound (0: RAM only)
    model_sha256: str = ""  # the file's digest, when the catalog knows it
    flush_s: float = FLUSH_S


def automatic_ram() -> int:
    return min(AUTO_RAM_MAX, psutil.virtual_memory().available // AUTO_RAM_SHARE)


def automatic_disk(directory: Path) -> int:
    directory.mkdir(parents=True, exist_ok=True)
    return min(AUTO_DISK_MAX, shutil.disk_usage(directory).free // AUTO_DISK_SHARE)


def worker_directory(root: Path, worker: str) -> Path:
    """A worker's own directory of kept prompts (workers sharing a data directory never share
    kept prompts: each keeps its own tiers)."""
    return Path(root) / (re.sub(r"[^A-Za-z0-9@._-]", "_", worker)[:100] or "embedded")


def layout_for(config: PromptCacheConfig, runner_config, runner) -> KvLayout:
    """The layout of a loaded runner's saved states (entries.KvLayout)."""
    stat = os.stat(runner_config.model_path)
    return KvLayout(
        model=config.model_sha256 or f"file:{os.path.abspath(runner_config.model_path)}",
        file_size=stat.st_size,
        file_mtime_ns=stat.st_mtime_ns,
        ctx_per_seq=runner.ctx_per_seq,
        kv_type=str(runner_config.kv_type),
        flash_attn=bool(runner_config.flash_attn),
        n_gpu_layers=int(runner_config.n_gpu_layers),
        state_format=runner.state_format,
    )


def open_store(config: PromptCacheConfig | None, runner_config, runner) -> PromptStore | None:
    """The runner's tiers, its disk tier's entries indexed; None when warm memory is off."""
    if config is None or config.ram_bytes <= 0:
        return None
    disk = None
    if config.directory and config.disk_bytes > 0:
        directory = Path(config.directory)
        # The bound is the box's: every worker's directory under the data directory's one. A
        # model with a projector keeps its encoded images there too (DiskTier).
        images = IMAGE_SHARE if getattr(runner, "takes_images", False) else 0.0
        disk = DiskTier(directory, layout_for(config, runner_config, runner), config.disk_bytes,
                        box_root=directory.parent, image_share=images)  # fmt: skip
    return PromptStore(config.ram_bytes, disk).open()
