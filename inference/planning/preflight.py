"""The check EngineHost runs before every load: is the file a GGUF we trust, and does it fit?

It runs where the engine runs (the web process when embedded, an inference worker in split
mode), so it reads only the file and the machine, never the database. A refusal raises, and the
host loads nothing:
- GGUFError: the file is broken or not a GGUF; llama.cpp never sees it.
- InsufficientMemory: the estimate for these settings does not fit in free memory; the message
  has the numbers.

It also sizes the context (`fit`, the host's preflight). A model's context per sequence is
automatic by default (n_ctx 0): its training context, at most AUTO_CTX_MAX, halved until the
whole estimate (weights, the KV cache of every sequence slot, compute) fits in AUTO_MEMORY_SHARE
of the free memory, never below AUTO_CTX_FLOOR (or the training context when that is smaller):
the floor is loaded or refused by the same check as an explicit setting. The share leaves room
for the OS, other models and a request that asks for more (Ollama's num_ctx, `min_ctx`), which
may use all of what is free.
"""

import dataclasses
import logging
import os
from fractions import Fraction
from functools import lru_cache

from inference.engine.host import ModelSpec
from inference.gguf import GGUFInfo, read_gguf
from inference.planning.machine import free_gpu_bytes, free_ram_bytes, gpu_readings
from inference.planning.memory import (
    AvailableMemory,
    InsufficientMemory,
    MemoryEstimate,
    check_fits,
    estimate_memory,
)

log = logging.getLogger(__name__)

AUTO_CTX_MAX = 32768
AUTO_CTX_FLOOR = 2048
AUTO_MEMORY_SHARE = Fraction(3, 4)


def available_memory() -> AvailableMemory:
    """What this box has free for a load now: RAM, and memory on the GPUs llama.cpp may use
    (inference.planning.machine.free_gpu_bytes, as the pages and announcements count it)."""
    return AvailableMemory(ram_bytes=free_ram_bytes(), gpu_bytes=free_gpu_bytes(gpu_readings()))


def validate(spec: ModelSpec) -> None:
    """The part of the check that needs no room made: the file must be a GGUF we trust. The
    host runs it before evicting anything, so a broken file never unloads a working model."""
    gguf_info(spec.config.model_path)


def fit(
    spec: ModelSpec, *, resident_bytes: int = 0, replacing: ModelSpec | None = None
) -> ModelSpec:
    """The host's preflight: `spec` with its context per sequence sized (automatic resolved,
    at least spec.min_ctx), after the same check as `preflight`; raises to refuse the load."""
    info = gguf_info(spec.config.model_path)  # GGUFError propagates: the load is refused
    available = _free_for(info, resident_bytes, replacing)
    config = spec.config
    ctx = max(config.ctx_per_seq or automatic_ctx(info, config, available), spec.min_ctx)
    sized = dataclasses.replace(spec, config=dataclasses.replace(config, ctx_per_seq=ctx))
    _check(sized, info, available)
    return sized


def preflight(
    spec: ModelSpec, *, resident_bytes: int = 0, replacing: ModelSpec | None = None
) -> MemoryEstimate | None:
    """Refuse a load before llama.cpp is asked; returns the estimate it checked (None when the
    model's metadata cannot be sized, e.g. an architecture without attention heads). An
    automatic context is sized first, as `fit` does.

    `resident_bytes`: the weights of the models already loaded in other runner processes. They
    are mmapped, so the OS counts their pages as reclaimable cache in "available" RAM; giving
    them to a new model would make the loaded ones read their weights from disk again.
    `replacing`: the loaded spec of this model that the load replaces (a reload for a larger
    context); what it holds besides the mmapped weights counts as free."""
    info = gguf_info(spec.config.model_path)
    available = _free_for(info, resident_bytes, replacing)
    config = spec.config
    if not config.ctx_per_seq:
        config = dataclasses.replace(config, ctx_per_seq=automatic_ctx(info, config, available))
    return _check(dataclasses.replace(spec, config=config), info, available)


def _check(spec: ModelSpec, info: GGUFInfo, available: AvailableMemory) -> MemoryEstimate | None:
    estimate = estimate_for_config(info, spec.config)
    if estimate is None:
        log.warning("%s: no memory estimate possible; loading without the check", spec.name)
        return None
    try:
        check_fits(estimate, available)
    except InsufficientMemory as exc:
        config = spec.config
        slots = config.parallel + config.cache_slots
        raise InsufficientMemory(
            f"{exc}, for {config.ctx_per_seq} tokens per sequence in each of {slots} sequence "
            "slots"
        ) from None
    return estimate


def _free_for(
    info: GGUFInfo, resident_bytes: int, replacing: ModelSpec | None
) -> AvailableMemory:
    available = available_memory()
    ram, gpu = available.ram_bytes, available.gpu_bytes
    if ram is not None and resident_bytes:
        ram = max(0, ram - resident_bytes)
    loaded = estimate_for_config(info, replacing.config) if replacing is not None else None
    if loaded is not None:
        # Its weights are mmapped pages the OS counts as free already; its KV cache and
        # compute buffers (and everything it holds on the GPU) are freed by the unload. The
        # split between GPU and RAM is check_fits's.
        on_gpu = gpu is not None and loaded.gpu_layers > 0
        kv_and_compute = loaded.kv_cache_bytes + loaded.compute_bytes
        if on_gpu:
            gpu += loaded.gpu_bytes
            kv_and_compute -= loaded.gpu_kv_cache_bytes + loaded.gpu_compute_bytes
        if ram is not None:
            ram += kv_and_compute
    return AvailableMemory(ram_bytes=ram, gpu_bytes=gpu)


def automatic_ctx(info: GGUFInfo, config, available: AvailableMemory | None = None) -> int:
    """The automatic context per sequence for a RunnerConfig's other settings (module doc)."""
    return _automatic(info, _config_settings(config), available)


def _automatic(info: GGUFInfo, settings: dict, available: AvailableMemory | None) -> int:
    trained = info.context_length or AUTO_CTX_FLOOR
    floor = min(AUTO_CTX_FLOOR, trained)
    available = available_memory() if available is None else available
    share = AvailableMemory(
        ram_bytes=None if available.ram_bytes is None
        else int(available.ram_bytes * AUTO_MEMORY_SHARE),
        gpu_bytes=None if available.gpu_bytes is None
        else int(available.gpu_bytes * AUTO_MEMORY_SHARE),
    )  # fmt: skip
    ctx = min(trained, AUTO_CTX_MAX)
    while ctx > floor:
        estimate = _estimate(info, ctx_per_seq=ctx, **settings)
        if estimate is None:
            return floor  # nothing to size it by: the floor
        try:
            check_fits(estimate, share)
            return ctx
        except InsufficientMemory:
            ctx //= 2
    return floor


def estimate_for_config(info: GGUFInfo, config) -> MemoryEstimate | None:
    """The estimate for a RunnerConfig's settings. llama.cpp gets one KV stream of ctx_per_seq
    cells per sequence slot, running or cached (inference.engine.runner), and never a
    micro-batch larger than the batch."""
    return estimate_for_settings(info, ctx_per_seq=config.ctx_per_seq, **_config_settings(config))


def _config_settings(config) -> dict:
    """A RunnerConfig's settings that the estimate depends on, besides the context."""
    return {
        "parallel": config.parallel, "cache_slots": config.cache_slots,
        "kv_type": config.kv_type, "n_gpu_layers": config.n_gpu_layers,
        "n_batch": config.n_batch, "n_ubatch": config.n_ubatch,
    }  # fmt: skip


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
    available: AvailableMemory | None = None,
) -> MemoryEstimate | None:
    """The estimate for these settings; ctx_per_seq 0 (automatic) is sized first, against
    `available` (default: this machine's free memory), as the load will size it."""
    settings = {
        "parallel": parallel, "cache_slots": cache_slots, "kv_type": kv_type,
        "n_gpu_layers": n_gpu_layers, "n_batch": n_batch, "n_ubatch": n_ubatch,
    }  # fmt: skip
    if not ctx_per_seq:
        ctx_per_seq = _automatic(info, settings, available)
    return _estimate(info, ctx_per_seq=ctx_per_seq, **settings)


def _estimate(
    info: GGUFInfo,
    *,
    ctx_per_seq: int,
    parallel: int,
    kv_type: str,
    n_gpu_layers: int,
    n_batch: int,
    n_ubatch: int,
    cache_slots: int | None,
) -> MemoryEstimate | None:
    # Prefix-cache slots hold KV too; inference.catalog.specs.spec_for gives a model as many as
    # `parallel`.
    slots = parallel + (parallel if cache_slots is None else cache_slots)
    try:
        return estimate_memory(
            info,
            n_ctx_total=ctx_per_seq * slots,
            kv_type=kv_type,
            n_gpu_layers=n_gpu_layers,
            parallel=parallel,
            n_ubatch=min(n_ubatch, n_batch),
            ctx_per_seq=ctx_per_seq,
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
