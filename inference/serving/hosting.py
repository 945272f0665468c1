"""The serving host of one process: every loaded model in a runner process of its supervisor.

The embedded client (the web process) and an inference worker (split mode) each build one; the
settings say how many models, how long a queue, where the CPU self-check keeps its verdict.
"""

from django.conf import settings

from inference.engine.host import EngineHost, ModelSpec
from inference.serving.supervisor import RunnerSupervisor


def make_supervisor() -> RunnerSupervisor:
    return RunnerSupervisor(
        itl_target=settings.ITL_TARGET_MS / 1000.0,
        background_itl_target=settings.BACKGROUND_ITL_TARGET_MS / 1000.0,
        max_queue=settings.ENGINE_MAX_QUEUE,
        state_dir=settings.DATA_DIR,
    )


def make_host(supervisor: RunnerSupervisor) -> EngineHost:
    """The serving host: every loaded model in a runner process of `supervisor`."""
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
    return host
