"""The serving host of one process: every loaded model in a runner process of its supervisor.

The embedded client (the web process) and an inference worker (split mode) each build one; the
settings say how many models, how long a queue, where the CPU self-check keeps its verdict.
"""

from django.conf import settings

from inference.engine.host import EngineHost, ModelSpec
from inference.engine.tiers.config import (
    PromptCacheConfig,
    automatic_disk,
    automatic_ram,
    worker_directory,
)
from inference.serving import warm_start
from inference.serving.supervisor import RunnerSupervisor
from inference.serving.warm_start import LoadedRecord

EMBEDDED = "embedded"  # the web process's own "worker" (its kept prompts' directory)


def make_supervisor(worker: str = EMBEDDED) -> RunnerSupervisor:
    return RunnerSupervisor(
        itl_target=settings.ITL_TARGET_MS / 1000.0,
        background_itl_target=settings.BACKGROUND_ITL_TARGET_MS / 1000.0,
        max_queue=settings.ENGINE_MAX_QUEUE,
        state_dir=settings.DATA_DIR,
        prompt_cache=prompt_cache_config(worker),
        spare_runner=True,
        speculative=settings.SPECULATIVE_DECODING,
    )


def prompt_cache_config(worker: str) -> PromptCacheConfig:
    """Warm memory for this worker's runners (inference.engine.tiers.config): its directory,
    each runner's share of the RAM bound, the disk bound."""
    directory = worker_directory(prompt_cache_root(), worker)
    ram = settings.PROMPT_CACHE_RAM
    disk = settings.PROMPT_CACHE_DISK
    ram = automatic_ram() if ram is None else ram
    disk = automatic_disk(directory) if disk is None else disk
    return PromptCacheConfig(str(directory), ram // settings.MAX_LOADED_MODELS, disk)


def prompt_cache_root():
    return settings.DATA_DIR / "kv-cache"


def make_host(supervisor: RunnerSupervisor, worker: str = EMBEDDED) -> EngineHost:
    """The serving host: every loaded model in a runner process of `supervisor`; what it has
    loaded recorded for the next start (inference.serving.warm_start)."""
    # GGUF check; context sized, memory vs free
    from inference.planning.preflight import fit, validate

    def fits_beside_the_loaded(spec: ModelSpec, replacing: ModelSpec | None = None) -> ModelSpec:
        # Runs under the host's load lock, after room was made: what is loaded now stays.
        others = [row for row in host.loaded() if row["name"] != spec.name]
        return fit(spec, resident_bytes=sum(row["size_bytes"] for row in others),
                   replacing=replacing)  # fmt: skip

    host = EngineHost(
        supervisor.start,
        max_loaded=settings.MAX_LOADED_MODELS,
        validate=validate,
        preflight=fits_beside_the_loaded,
    )
    host.on_change = loaded_record(worker).write
    return host


def loaded_record(worker: str) -> LoadedRecord:
    """Where a worker records the models it has loaded (one file per worker in DATA_DIR)."""
    return LoadedRecord(worker_directory(settings.DATA_DIR / "loaded-models", worker)
                        .with_suffix(".json"))  # fmt: skip


def reload_previous(host: EngineHost, worker: str = EMBEDDED, resolve=None):
    """At start: load again what was loaded before the last stop, in the background; None when
    RELOAD_MODELS_AT_START is off."""
    if not settings.RELOAD_MODELS_AT_START:
        return None
    extra = {"resolve": resolve} if resolve is not None else {}
    return warm_start.reload_previous(host, loaded_record(worker), **extra)
