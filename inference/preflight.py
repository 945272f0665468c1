"""The check EngineHost runs before every load: is the file a GGUF we trust, and does it fit?

It runs where the engine runs (the web process when embedded, an inference worker in split
mode), so it reads only the file and the machine, never the database. A refusal raises, and the
host loads nothing:
- GGUFError: the file is broken or not a GGUF; llama.cpp never sees it.
- InsufficientMemory: the estimate for these settings does not fit in free memory; the message
  has the numbers.
"""

import dataclasses
import logging
import os
from functools import lru_cache

from inference.engine.host import ModelSpec
from inference.gguf import GGUFInfo, read_gguf
from inference.memory import MemoryEstimate, available_memory, check_fits, estimate_memory

log = logging.getLogger(__name__)


def validate(spec: ModelSpec) -> None:
    """The part of the check that needs no room made: the file must be a GGUF we trust. The
    host runs it before evicting anything, so a broken file never unloads a working model."""
    gguf_info(spec.config.model_path)


def preflight(spec: ModelSpec, *, resident_bytes: int = 0) -> MemoryEstimate | None:
    """Refuse a load before llama.cpp is asked; returns the estimate it checked (None when the
    model's metadata cannot be sized, e.g. an architecture without attention heads).

    `resident_bytes`: the weights of the models already loaded in other runner processes. They
    are mmapped, so the OS counts their pages as reclaimable cache in "available" RAM; giving
    them to a new model would make the loaded ones read their weights from disk again."""
    config = spec.config
    info = gguf_info(config.model_path)  # GGUFError propagates: the load is refused
    estimate = estimate_for_config(info, config)
    if estimate is None:
        log.warning("%s: no memory estimate possible; loading without the check", spec.name)
        return None
    available = available_memory()
    if available.ram_bytes is not None and resident_bytes:
        available = dataclasses.replace(
            available, ram_bytes=max(0, available.ram_bytes - resident_bytes)
        )
    check_fits(estimate, available)
    return estimate


def estimate_for_config(info: GGUFInfo, config) -> MemoryEstimate | None:
    """The estimate for a RunnerConfig's settings. llama.cpp gets one KV stream of ctx_per_seq
    cells per sequence slot, running or cached (inference.engine.runner), and never a
    micro-batch larger than the batch."""
    return estimate_for_settings(
        info,
        ctx_per_seq=config.ctx_per_seq,
        parallel=config.parallel,
        cache_slots=config.cache_slots,
        kv_type=config.kv_type,
        n_gpu_layers=config.n_gpu_layers,
        n_batch=config.n_batch,
        n_ubatch=config.n_ubatch,
    )


def estimate_for_settings(
    info: GGUFInfo,
    *,
    ctx_per_seq: int,
    parallel: int,
    kv_type: str,
    n_gpu_layers: int,
    n_batch: int,
    n_ubatch: int,
    cache_slots: int | None = None,
) -> MemoryEstimate | None:
    # Prefix-cache slots hold KV too; registry.spec_for gives a model as many as `parallel`.
    slots = parallel + (parallel if cache_slots is None else cache_slots)
    try:
        return estimate_memory(
            info,
            n_ctx_total=ctx_per_seq * slots,
            kv_type=kv_type,
            n_gpu_layers=n_gpu_layers,
            parallel=parallel,
            n_ubatch=min(n_ubatch, n_batch),
        )
    except ValueError as exc:  # the metadata lacks what sizing needs
        log.info("cannot estimate memory for %s: %s", info.path, exc)
        return None


def gguf_info(path: str | os.PathLike[str]) -> GGUFInfo:
    """read_gguf, remembered per (path, size, mtime): pages ask for the same file's estimate on
    every view, and the header of a 250k-token vocabulary takes a while to walk."""
    try:
        stat = os.stat(path)
    except OSError:
        return read_gguf(path)  # raises GGUFError with the reason
    return _cached_info(os.fspath(path), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=32)
def _cached_info(path: str, size: int, mtime_ns: int) -> GGUFInfo:
    return read_gguf(path)
