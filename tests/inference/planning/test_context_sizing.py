"""Sizing a model's context per sequence: automatic (n_ctx 0) is the training context when the
memory estimate fits in a share of what is free, less on a small box but never below the floor,
and a context asked for more is checked against all of it, with the numbers when it is refused.
On the real starter model (SmolLM2-135M, trained for 8192)."""

import dataclasses

import pytest

from inference.catalog.specs import context_asked, spec_for
from inference.engine.host import ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.gguf import read_gguf
from inference.planning import preflight as preflight_module
from inference.planning.fitting import AUTO_CTX_FLOOR, AUTO_MEMORY_SHARE
from inference.planning.memory import AvailableMemory, InsufficientMemory
from inference.planning.preflight import (
    automatic_ctx,
    estimate_for_config,
    estimate_for_settings,
    fit,
)
from tests.inference.engine.fakes import engines_on

GiB = 1 << 30


def spec(path, min_ctx: int = 0, **settings) -> ModelSpec:
    config = RunnerConfig(model_path=str(path), **{"ctx_per_seq": 0, **settings})
    return ModelSpec("m", config, keep_alive=-1, min_ctx=min_ctx)


def free(monkeypatch, ram_bytes: int, gpu_bytes: int | None = None) -> AvailableMemory:
    available = AvailableMemory(ram_bytes=ram_bytes, gpu_bytes=gpu_bytes)
    monkeypatch.setattr(preflight_module, "available_memory", lambda: available)
    return available


def needed(path, ctx: int) -> int:
    config = RunnerConfig(model_path=str(path), ctx_per_seq=ctx)
    return estimate_for_config(read_gguf(path), config).total_bytes


def test_the_starter_model_gets_its_training_context_with_a_few_gb_free(starter_path, monkeypatch):
    free(monkeypatch, 3 * GiB)
    sized = fit(spec(starter_path))  # the registry's defaults: 4 running + 4 cached slots
    assert read_gguf(starter_path).context_length == 8192
    assert sized.config.ctx_per_seq == 8192
    # ... and the whole estimate at 8192 x 8 slots is inside the share of free memory.
    assert needed(starter_path, 8192) <= 3 * GiB * AUTO_MEMORY_SHARE


def test_a_small_box_gets_the_largest_halving_that_fits_in_the_share(starter_path, monkeypatch):
    ram = int(needed(starter_path, 4096) / AUTO_MEMORY_SHARE) + (1 << 20)
    free(monkeypatch, ram)
    assert fit(spec(starter_path)).config.ctx_per_seq == 4096


def test_a_box_too_small_for_the_floor_is_refused_with_the_numbers(starter_path, monkeypatch):
    free(monkeypatch, 50 << 20)
    with pytest.raises(InsufficientMemory) as refused:
        fit(spec(starter_path))
    message = str(refused.value)
    assert "of RAM is free" in message
    assert f"for {AUTO_CTX_FLOOR} tokens per sequence in each of 8 sequence slots" in message


def test_a_model_trained_for_less_than_the_floor_gets_its_training_context(tiny_file):
    info = read_gguf(tiny_file)
    config = RunnerConfig(model_path=str(tiny_file), ctx_per_seq=0)
    assert info.context_length == 256
    assert automatic_ctx(info, config, AvailableMemory(ram_bytes=64 * GiB, gpu_bytes=None)) == 256


def test_an_explicit_setting_is_kept_whatever_is_free(starter_path, monkeypatch):
    free(monkeypatch, 64 * GiB)
    assert fit(spec(starter_path, ctx_per_seq=1024)).config.ctx_per_seq == 1024


def test_a_context_asked_for_is_loaded_when_all_of_free_memory_holds_it(starter_path, monkeypatch):
    # Automatic stops at the share; an asked context may use everything that is free.
    ram = needed(starter_path, 8192) + (8 << 20)
    free(monkeypatch, ram)
    assert fit(spec(starter_path)).config.ctx_per_seq == 4096
    assert fit(spec(starter_path, min_ctx=8192)).config.ctx_per_seq == 8192


def test_a_context_asked_for_that_cannot_fit_is_refused_with_the_numbers(starter_path, monkeypatch):
    free(monkeypatch, needed(starter_path, 4096))
    with pytest.raises(InsufficientMemory, match=r"needs \d+(\.\d)? [MG]iB .* of RAM is free, "
                       "for 8192 tokens per sequence in each of 8 sequence slots"):  # fmt: skip
        fit(spec(starter_path, min_ctx=8192))


def test_a_reload_counts_what_the_loaded_one_frees(starter_path, monkeypatch):
    """The loaded engine's KV cache and compute buffers go with it; its weights are mmapped
    pages that count as free already."""
    loaded = dataclasses.replace(
        spec(starter_path), config=RunnerConfig(model_path=str(starter_path), ctx_per_seq=4096)
    )
    kv_and_compute = needed(starter_path, 4096) - read_gguf(starter_path).weights_bytes
    free(monkeypatch, needed(starter_path, 8192) - kv_and_compute + (8 << 20))
    with pytest.raises(InsufficientMemory):
        fit(spec(starter_path, min_ctx=8192))
    assert fit(spec(starter_path, min_ctx=8192), replacing=loaded).config.ctx_per_seq == 8192


def test_the_estimate_of_an_automatic_setting_is_the_one_the_load_will_check(starter_path):
    plenty = AvailableMemory(ram_bytes=64 * GiB, gpu_bytes=None)
    estimate = estimate_for_settings(
        read_gguf(starter_path), ctx_per_seq=0, parallel=4, kv_type="f16", n_gpu_layers=-1,
        n_batch=512, n_ubatch=512, available=plenty,
    )  # fmt: skip
    assert estimate.ctx_per_seq == 8192
    assert estimate.n_ctx_total == 8192 * 8  # one stream per running and cached slot
    assert estimate.total_bytes == needed(starter_path, 8192)


def test_num_ctx_is_clamped_at_the_training_context(starter_model):
    starter_model.context_length = 8192
    assert context_asked(starter_model, None) == 0
    assert context_asked(starter_model, 4096) == 4096
    assert context_asked(starter_model, 8192) == 8192
    assert context_asked(starter_model, 32768) == 8192
    assert spec_for(starter_model, min_ctx=8192).min_ctx == 8192


async def test_a_context_that_cannot_fit_is_refused_as_a_507_with_the_numbers(
    starter_path, monkeypatch
):
    from dashboard.api.errors import from_event
    from inference.engine import GenerationRequest, SamplingParams
    from inference.engine.host import EngineHost
    from inference.serving.client import EmbeddedClient

    def no_runner(config):
        raise AssertionError("a load that cannot fit reached llama.cpp")

    free(monkeypatch, needed(starter_path, 4096))
    client = EmbeddedClient(EngineHost(engines_on(no_runner), preflight=fit))
    try:
        request = GenerationRequest("Hi", SamplingParams(max_tokens=1), model="m")
        events = [e async for e in client.stream(request, spec(starter_path, min_ctx=8192))]
    finally:
        client.host.shutdown()

    (event,) = events
    assert event["type"] == "error" and event["code"] == "no_memory"
    refused = from_event(event)
    assert refused.status == 507 and refused.code == "insufficient_memory"
    assert "of RAM is free, for 8192 tokens per sequence" in refused.message
