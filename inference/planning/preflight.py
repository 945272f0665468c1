"""The check EngineHost runs before every load: is the file a GGUF we trust, and does it fit?

It runs where the engine runs (the web process when embedded, an inference worker in split
mode), so it reads only the file and the machine, never the database. A refusal raises, and the
host loads nothing:
- GGUFError: the file is broken or not a GGUF; llama.cpp never sees it.
- InsufficientMemory: the estimate for these settings does not fit in free memory; the message
  has the numbers.

- ProjectorError (a GGUFError): the model's vision projector is not one libmtmd can use for
  it (inference.gguf.projector); libmtmd never sees it.

It also fits the load to the machine (`fit`, the host's preflight): an automatic context, and with
a GPU the KV type, the layers on the GPU and the batch, with the reason said
(inference.planning.fitting). The estimate it checks is the one the model page shows.
"""

import dataclasses
import logging
import os
from functools import lru_cache

from inference.engine.host import ModelSpec
from inference.engine.runner_config import DRAFT_CATCH_UP, DRAFT_WINDOW
from inference.gguf import GGUFError, GGUFInfo, read_gguf
from inference.gguf.projector import ProjectorInfo, check_projector
from inference.planning import fitting
from inference.planning.fitting import Fitted
from inference.planning.machine import free_gpu_bytes, free_ram_bytes, gpu_readings, usable_gpus
from inference.planning.memory import (
    AvailableMemory,
    InsufficientMemory,
    MemoryEstimate,
    check_fits,
    estimate_memory,
    with_draft,
    with_projector,
)

log = logging.getLogger(__name__)


def available_memory() -> AvailableMemory:
    """What this box has free for a load now: RAM, and memory on the GPUs llama.cpp may use
    (inference.planning.machine.free_gpu_bytes, as the pages and announcements count it)."""
    gpus = gpu_readings()
    return AvailableMemory(ram_bytes=free_ram_bytes(), gpu_bytes=free_gpu_bytes(gpus),
                           gpu_count=len(usable_gpus(gpus)))  # fmt: skip


def validate(spec: ModelSpec) -> None:
    """The part of the check that needs no room made: the file must be a GGUF we trust. The
    host runs it before evicting anything, so a broken file never unloads a working model.
    Its vision projector likewise, checked against the model."""
    projector_of(spec.config, gguf_info(spec.config.model_path))


def projector_of(config, info: GGUFInfo) -> ProjectorInfo | None:
    """The config's vision projector (None: none), its header checked against the model's
    width; raises ProjectorError (a GGUFError) for one libmtmd must not read."""
    if not config.mmproj_path:
        return None
    return check_projector(gguf_info(config.mmproj_path), info.embedding_length)


def fit(
    spec: ModelSpec, *, resident_bytes: int = 0, replacing: ModelSpec | None = None
) -> ModelSpec:
    """The host's preflight: `spec` fitted to the machine (its context per sequence sized, at
    least spec.min_ctx; with a GPU its KV type, GPU layers and batch too; why in
    `spec.fitted`), after the same check as `preflight`; raises to refuse the load."""
    info = gguf_info(spec.config.model_path)  # GGUFError propagates: the load is refused
    projector_of(spec.config, info)  # and so does a projector's
    spec = dataclasses.replace(spec, config=_usable_draft(spec.config))
    available = _free_for(info, resident_bytes, replacing)
    fitted = _fitted(info, spec.config, available, min_ctx=spec.min_ctx)
    sized = dataclasses.replace(spec, config=fitted.applied_to(spec.config), fitted=fitted.reason)
    sized = _draft_that_fits(sized, info, available)
    _check(sized, info, available)
    if fitted.reason:
        log.info("%s: %s", spec.name, fitted.reason)
    return sized


def _usable_draft(config):
    """The config with its draft model only where the draft's GGUF header passes the same
    validation as a model's (llama.cpp never reads a file that failed it): a draft model that
    is missing on this box or broken is left out, and the model loads without it."""
    if not config.draft_model_path:
        return config
    try:
        gguf_info(config.draft_model_path)
    except (GGUFError, OSError) as exc:
        log.warning("the draft model %s is left out: %s", config.draft_model_path, exc)
        return dataclasses.replace(config, draft_model_path="")
    return config


def _draft_that_fits(spec: ModelSpec, info: GGUFInfo, available: AvailableMemory) -> ModelSpec:
    """The fit sizes the model alone; where its draft model would then not fit beside it, the
    draft is left out rather than the load refused: a model that loaded before a draft was
    chosen still loads."""
    config = spec.config
    if not config.draft_model_path:
        return spec
    estimate = estimate_for_config(info, config)
    try:
        if estimate is not None:
            check_fits(estimate, available)
    except InsufficientMemory as exc:
        log.warning("%s: its draft model is left out: with it the load %s", spec.name, exc)
        return dataclasses.replace(spec, config=dataclasses.replace(config, draft_model_path=""))
    return spec


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
    config = _fitted(info, spec.config, available).applied_to(spec.config)
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
        on_gpu = gpu is not None and loaded.gpu_bytes > 0
        kv_and_compute = loaded.kv_cache_bytes + loaded.compute_bytes
        if on_gpu:
            gpu += loaded.gpu_bytes
            kv_and_compute -= loaded.gpu_kv_cache_bytes + loaded.gpu_compute_bytes
        if ram is not None:
            ram += kv_and_compute
    return dataclasses.replace(available, ram_bytes=ram, gpu_bytes=gpu)


def automatic_ctx(info: GGUFInfo, config, available: AvailableMemory | None = None) -> int:
    """The automatic context per sequence for a RunnerConfig's other settings, as the load
    would fit it (inference.planning.fitting)."""
    automatic = dataclasses.replace(config, ctx_per_seq=0)
    return _fitted(info, automatic, available or available_memory()).ctx_per_seq


def _fitted(info: GGUFInfo, config, available: AvailableMemory, min_ctx: int = 0) -> Fitted:
    return fitting.fit(info, _config_settings(config), available, estimate=_estimate,
                       min_ctx=min_ctx)  # fmt: skip


def estimate_for_config(info: GGUFInfo, config) -> MemoryEstimate | None:
    """The estimate for a RunnerConfig's settings. llama.cpp gets one KV stream of ctx_per_seq
    cells per sequence slot, running or cached (inference.engine.runner), and never a
    micro-batch larger than the batch. A draft model (config.draft_model_path) adds its own
    weights, its KV (DRAFT_WINDOW cells per sequence slot) and compute."""
    estimate = _estimate(info, **_config_settings(config))
    if estimate is None or not config.draft_model_path:
        return estimate
    return adding_draft(estimate, config.draft_model_path, sequences=config.parallel
                        + config.cache_slots, kv_type=config.kv_type,
                        n_gpu_layers=config.n_gpu_layers)  # fmt: skip


def adding_draft(estimate: MemoryEstimate, draft_path: str, *, sequences: int, kv_type: str,
                 n_gpu_layers: int) -> MemoryEstimate:  # fmt: skip
    """`estimate` with a draft model's weights, KV (DRAFT_WINDOW cells a sequence) and compute
    added (inference.engine.draft_model); as it was where the draft's file cannot be sized."""
    try:
        draft = estimate_memory(
            gguf_info(draft_path), n_ctx_total=DRAFT_WINDOW * sequences, kv_type=kv_type,
            n_gpu_layers=n_gpu_layers, parallel=sequences, n_ubatch=2 * DRAFT_CATCH_UP,
        )  # fmt: skip
    except (ValueError, OSError) as exc:  # GGUFError is a ValueError
        log.info("cannot estimate memory for the draft model %s: %s", draft_path, exc)
        return estimate
    return with_draft(estimate, draft)


def _config_settings(config) -> dict:
    """A RunnerConfig's settings that the estimate depends on, besides the context."""
    return {
        "ctx_per_seq": config.ctx_per_seq, "parallel": config.parallel,
        "cache_slots": config.cache_slots, "kv_type": config.kv_type,
        "n_gpu_layers": config.n_gpu_layers, "n_batch": config.n_batch,
        "n_ubatch": config.n_ubatch, "flash_attn": config.flash_attn,
        "mmproj_path": config.mmproj_path,
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
    flash_attn: bool = True,
    mmproj_path: str = "",
) -> MemoryEstimate | None:
    """The estimate for these settings as the load will fit them to `available` (default: this
    machine's free memory): ctx_per_seq 0 (automatic) sized, and with a GPU the KV type, layers
    and batch chosen (inference.planning.fitting); `reason` says what was chosen and why. A
    vision projector (`mmproj_path`) counts, so the automatic context leaves it room."""
    settings = {
        "ctx_per_seq": ctx_per_seq, "parallel": parallel, "cache_slots": cache_slots,
        "kv_type": kv_type, "n_gpu_layers": n_gpu_layers, "n_batch": n_batch,
        "n_ubatch": n_ubatch, "flash_attn": flash_attn, "mmproj_path": mmproj_path,
    }  # fmt: skip
    fitted = fitting.fit(info, settings, available or available_memory(), estimate=_estimate)
    if fitted.estimate is None:
        return None
    return dataclasses.replace(fitted.estimate, reason=fitted.reason)


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
    flash_attn: bool = True,  # decides whether the KV may be quantised, not its size
    mmproj_path: str = "",
) -> MemoryEstimate | None:
    # Prefix-cache slots hold KV too; inference.catalog.specs.spec_for gives a model as many as
    # `parallel`.
    slots = parallel + (parallel if cache_slots is None else cache_slots)
    try:
        estimate = estimate_memory(
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
    if not mmproj_path:
        return estimate
    try:
        return with_projector(estimate, check_projector(gguf_info(mmproj_path), None))
    except (GGUFError, OSError) as exc:  # refused where it loads (validate); sized without
        log.info("cannot estimate memory for the projector %s: %s", mmproj_path, exc)
        return estimate


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
