"""What the engine gets for a registered model: how to load it (spec_for: a ModelSpec), how to
ask it (sampling_for, request_for: a GenerationRequest), how long to keep it (parse_keep_alive)
and how much context a request needs (context_asked)."""

import logging
import re
from typing import TYPE_CHECKING

from django.conf import settings

from inference.engine.generation import GenerationRequest
from inference.engine.host import ModelSpec
from inference.engine.params import SamplingParams, usable_defaults
from inference.engine.runner_config import RunnerConfig
from inference.models import LLMModel

if TYPE_CHECKING:
    from inference.text.prompting import Prompt

log = logging.getLogger(__name__)

_DURATION = re.compile(r"^(-?\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_keep_alive(value: str | int | float | None) -> float | None:
    """Ollama's keep_alive: "5m", "1h", "30s", a number of seconds; 0 unloads right after the
    answer; negative keeps the model loaded (returned as -1). None and "" mean "not given"."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise ValueError("keep_alive must be a duration such as 5m, 30s, 0 or -1")
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        match = _DURATION.match(value.strip())
        if not match:
            raise ValueError(
                f"keep_alive must be a duration such as 5m, 30s, 0 or -1, got {value!r}"
            )
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
    if seconds < 0:
        return -1.0
    if seconds > 366 * 24 * 3600:
        raise ValueError("keep_alive must be at most a year")
    return seconds


def kept_slots(parallel: int) -> int:
    """Sequence slots beyond the `parallel` answering ones that only keep finished turns. With
    warm memory on (PROMPT_CACHE_RAM), none: a finished turn's KV stays in its slot until the
    slot is needed and then goes to the RAM tier (a copy of ~1 ms), so the load allocates no
    KV for kept turns (the starter model: 4 slots of 8,192 tokens load in 0.5 s, 8 in 1.0 s).
    Without it, as many as answer, as before tiers existed."""
    return 0 if settings.PROMPT_CACHE_RAM != 0 else parallel


def spec_for(model: LLMModel, *, min_ctx: int = 0) -> ModelSpec:
    """How to load the model. Its n_ctx 0 (automatic) stays 0: the host's preflight sizes it
    where the engine runs (inference.planning.preflight.fit). `min_ctx`: the context per sequence a
    request needs (see context_asked); a loaded engine with less is reloaded. A derived model
    loads as its base (its name, file and settings), so the two share one engine."""
    model = model.weights
    keep_alive = parse_keep_alive(model.keep_alive or settings.DEFAULT_KEEP_ALIVE)
    config = RunnerConfig(
        model_path=model.file_path,
        ctx_per_seq=model.n_ctx,
        parallel=model.parallel,
        cache_slots=kept_slots(model.parallel),
        speculative=model.speculative,
        draft_model_path=model.draft.weights.file_path if model.draft_id else "",
        mmproj_path=model.projector.file_path if model.projector_id else "",
        mmproj_sha256=model.projector.sha256 if model.projector_id else "",
        n_batch=model.n_batch,
        n_ubatch=model.n_ubatch,
        n_threads=settings.ENGINE_THREADS or model.n_threads,
        n_gpu_layers=model.n_gpu_layers,
        kv_type=model.kv_type,
        flash_attn=model.flash_attn,
    )
    return ModelSpec(
        model.name,
        config,
        300.0 if keep_alive is None else keep_alive,
        min_ctx=min_ctx,
        sha256=model.sha256,
        draft_sha256=model.draft.weights.sha256 if model.draft_id else "",
        mmproj_sha256=model.projector.sha256 if model.projector_id else "",
    )


def sampling_for(model: LLMModel, asked: dict, base: dict | None = None) -> SamplingParams:
    """A request's sampling, the one place a model's defaults apply: what the request asks, over
    the model's saved defaults (its page, a pull), over `base` (the chat page's own), over the
    engine's; a derived model's own defaults over its base's. Raises InvalidParams for an asked
    value out of bounds."""
    saved = usable_defaults(model.default_params)
    if model.base_id:
        saved = {**usable_defaults(model.weights.default_params), **saved}
    return SamplingParams(**{**(base or {}), **saved, **asked})


def request_for(
    model: LLMModel,
    prompt: "Prompt",
    asked: dict,
    *,
    base: dict | None = None,
    **fields,
) -> GenerationRequest:
    """The request to send for a rendered prompt (inference.text.prompting.Prompt), built once,
    the same for the chat page and every API dialect: the model's sampling (sampling_for), the
    prompt's BOS rule and images, and the caller's ids and keys (`fields`: cache_key,
    cache_partition, keep_alive, arrived_wall: None for now). Raises InvalidParams."""
    if fields.get("arrived_wall") is None:
        fields.pop("arrived_wall", None)
    # A derived model runs on its base's engine (spec_for), with its own sampling and prompt.
    sent = prompt.text if prompt.tokens is None else prompt.tokens
    return GenerationRequest(sent, sampling_for(model, asked, base),
                             model=model.weights.name, add_special=prompt.add_special,
                             media=prompt.media, **fields)  # fmt: skip


def context_asked(model: LLMModel, num_ctx: int | None) -> int:
    """The context per sequence a request's num_ctx needs (0: none asked), clamped at the
    model's training context as Ollama clamps it: a home app's fixed num_ctx (Home Assistant
    sends 8192) keeps working with a model trained for less, and gets what the model holds."""
    if not num_ctx:
        return 0
    trained = model.context_length
    if trained and num_ctx > trained:
        log.info("num_ctx %d for %s clamped to its training context %d",
                 num_ctx, model.name, trained)  # fmt: skip
        return trained
    return num_ctx
