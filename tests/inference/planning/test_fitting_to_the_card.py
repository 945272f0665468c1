"""Fitting a load to the card, as llama-server's --fit does (context first, then the KV type,
then layers), against NVML's answers for recorded cards (tests.inference.planning.nvml); on the
real starter model (SmolLM2-135M: 30 layers, trained for 8192 tokens, 8 sequence slots)."""

import dataclasses

import pytest

from inference.engine.host import EngineHost, ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.gguf import read_gguf
from inference.planning import preflight as preflight_module
from inference.planning.fitting import AUTO_CTX_FLOOR, GPU_BATCH, GPU_MARGIN_BYTES
from inference.planning.preflight import (
    automatic_ctx,
    estimate_for_config,
    estimate_for_settings,
    fit,
)
from tests.inference.engine.fakes import FakeRunner, engines_on
from tests.inference.planning.nvml import GiB, MiB, h200, installed, laptop_4gb, rtx_3060

RAM = 16 * GiB


@pytest.fixture(autouse=True)
def plenty_of_ram(monkeypatch):
    monkeypatch.setattr(preflight_module, "free_ram_bytes", lambda: RAM)


def spec(path, **settings) -> ModelSpec:
    config = RunnerConfig(model_path=str(path), **{"ctx_per_seq": 0, **settings})
    return ModelSpec("starter", config, keep_alive=-1)


def on_gpu(path, ctx: int, kv_type: str = "f16", layers: int = -1) -> int:
    """The estimate's GPU part for these settings (the registry's defaults otherwise)."""
    config = RunnerConfig(model_path=str(path), ctx_per_seq=ctx, kv_type=kv_type,
                          n_gpu_layers=layers)  # fmt: skip
    return estimate_for_config(read_gguf(path), config).gpu_bytes


def card_with_room(room: int):
    """A 4 GB card with `room` bytes free beyond the margin (the rest held by other programs)."""
    card = laptop_4gb()
    return card.with_used(card.total_bytes - GPU_MARGIN_BYTES - room)


def test_a_big_card_gets_the_training_context_every_layer_and_a_gpu_sized_batch(
    starter_path, monkeypatch
):
    installed(monkeypatch, h200())
    sized = fit(spec(starter_path))
    config = sized.config
    assert (config.ctx_per_seq, config.kv_type, config.n_gpu_layers) == (8192, "f16", -1)
    assert config.n_batch == GPU_BATCH and config.n_ubatch == 512
    assert sized.fitted.startswith("fitted to the GPU (140.4 GiB free, less a 1.0 GiB margin)")
    assert "8192 tokens per sequence (the training context), KV cache f16" in sized.fitted
    assert "every layer on the GPU; prompts are read up to 2048 tokens a step" in sized.fitted


def test_the_context_shrinks_first_when_the_card_is_small(starter_path, monkeypatch):
    room = on_gpu(starter_path, 2048) + 16 * MiB
    assert room < on_gpu(starter_path, 4096)
    installed(monkeypatch, card_with_room(room))
    sized = fit(spec(starter_path))
    assert (sized.config.ctx_per_seq, sized.config.kv_type) == (2048, "f16")
    assert sized.config.n_gpu_layers == -1
    assert "2048 tokens per sequence (4096 did not fit), KV cache f16" in sized.fitted


def test_then_the_kv_cache_goes_to_q8_0(starter_path, monkeypatch):
    room = on_gpu(starter_path, 2048, "q8_0") + 8 * MiB
    assert room < on_gpu(starter_path, 2048, "f16")
    installed(monkeypatch, card_with_room(room))
    sized = fit(spec(starter_path))
    assert (sized.config.ctx_per_seq, sized.config.kv_type) == (AUTO_CTX_FLOOR, "q8_0")
    assert sized.config.n_gpu_layers == -1
    assert "KV cache q8_0 (f16 did not fit even at 2048 tokens), every layer" in sized.fitted


def test_then_layers_stay_in_ram_as_few_as_need_to(starter_path, monkeypatch):
    room = on_gpu(starter_path, 2048, "q8_0", layers=20) + MiB
    assert room < on_gpu(starter_path, 2048, "q8_0", layers=21)
    installed(monkeypatch, card_with_room(room))
    sized = fit(spec(starter_path))
    config = sized.config
    assert (config.ctx_per_seq, config.kv_type, config.n_gpu_layers) == (2048, "q8_0", 20)
    assert config.n_batch == 512  # the batch is raised only with every layer on the GPU
    assert "20 of 31 layers on the GPU (llama.cpp's count" in sized.fitted


def test_without_flash_attention_the_kv_cache_stays_f16(starter_path, monkeypatch):
    room = on_gpu(starter_path, 2048, "q8_0") + 8 * MiB
    installed(monkeypatch, card_with_room(room))
    config = fit(spec(starter_path, flash_attn=False)).config
    assert config.kv_type == "f16" and 0 <= config.n_gpu_layers < 30


def test_a_context_set_on_the_page_is_kept_and_the_rest_is_fitted(starter_path, monkeypatch):
    room = on_gpu(starter_path, 8192, "q8_0") + 8 * MiB
    assert room < on_gpu(starter_path, 8192, "f16")
    installed(monkeypatch, card_with_room(room))
    sized = fit(spec(starter_path, ctx_per_seq=8192))
    assert (sized.config.ctx_per_seq, sized.config.kv_type) == (8192, "q8_0")
    assert "8192 tokens per sequence (as set)" in sized.fitted


def test_gpu_layers_set_on_the_page_size_only_the_context(starter_path, monkeypatch):
    installed(monkeypatch, rtx_3060())
    sized = fit(spec(starter_path, n_gpu_layers=10))
    config = sized.config
    assert (config.ctx_per_seq, config.kv_type, config.n_gpu_layers) == (8192, "f16", 10)
    assert config.n_batch == 512
    assert sized.fitted.startswith("automatic context: 8192 tokens per sequence")


def test_a_batch_set_on_the_page_is_kept(starter_path, monkeypatch):
    installed(monkeypatch, h200())
    assert fit(spec(starter_path, n_batch=1024)).config.n_batch == 1024


def test_every_visible_card_keeps_its_margin(starter_path, monkeypatch):
    # Free on both together: what 8192 needs with one margin and half a margin to spare; less
    # both margins, that leaves room for 4096 only.
    free_each = (on_gpu(starter_path, 8192) + GPU_MARGIN_BYTES * 3 // 2) // 2
    assert 2 * free_each - 2 * GPU_MARGIN_BYTES >= on_gpu(starter_path, 4096)
    one = laptop_4gb().with_used(laptop_4gb().total_bytes - free_each)
    installed(monkeypatch, one, dataclasses.replace(one))
    assert fit(spec(starter_path)).config.ctx_per_seq == 4096
    assert preflight_module.available_memory().gpu_count == 2


def test_a_card_hidden_from_llama_cpp_is_not_counted(starter_path, monkeypatch):
    installed(monkeypatch, card_with_room(on_gpu(starter_path, 2048) + 16 * MiB), h200())
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert fit(spec(starter_path)).config.ctx_per_seq == 2048


def test_without_a_gpu_the_automatic_context_says_why_it_is_what_it_is(starter_path, monkeypatch):
    installed(monkeypatch)  # no NVML: no GPU
    sized = fit(spec(starter_path))
    assert sized.config.ctx_per_seq == 8192 and sized.config.n_batch == 512
    assert sized.fitted == (
        "automatic context: 8192 tokens per sequence (the training context), the most that fits "
        "in 3/4 of the free RAM (16.0 GiB)"
    )


def test_a_context_set_on_a_box_without_a_gpu_needs_no_reason(starter_path, monkeypatch):
    installed(monkeypatch)
    assert fit(spec(starter_path, ctx_per_seq=1024)).fitted == ""


def test_the_page_estimate_and_the_chat_context_agree_with_the_load(starter_path, monkeypatch):
    room = on_gpu(starter_path, 2048, "q8_0") + 8 * MiB
    installed(monkeypatch, card_with_room(room))
    info = read_gguf(starter_path)
    config = spec(starter_path).config
    estimate = estimate_for_settings(
        info, ctx_per_seq=0, parallel=4, cache_slots=4, kv_type="f16", n_gpu_layers=-1,
        n_batch=512, n_ubatch=512,
    )  # fmt: skip
    sized = fit(spec(starter_path))
    assert estimate.kv_type == "q8_0" and estimate.ctx_per_seq == sized.config.ctx_per_seq
    assert estimate.reason == sized.fitted
    assert automatic_ctx(info, config) == sized.config.ctx_per_seq


def test_the_loaded_model_says_how_it_was_fitted(starter_path, monkeypatch):
    installed(monkeypatch, h200())
    configs = []

    def runner(config):
        configs.append(config)
        return FakeRunner(n_batch=config.n_batch)

    host = EngineHost(engines_on(runner), preflight=fit)
    try:
        host.load(spec(starter_path))
        assert configs[0].n_batch == GPU_BATCH and configs[0].ctx_per_seq == 8192
        assert host.loaded()[0]["fitted"].startswith("fitted to the GPU")
    finally:
        host.shutdown()
