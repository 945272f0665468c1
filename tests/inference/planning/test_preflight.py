"""The check before every load: a broken GGUF never reaches llama.cpp, and a load that cannot fit
is refused with the numbers."""

import pytest

from inference.engine.host import EngineHost, ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.gguf import GGUFError, read_gguf
from inference.planning import preflight as preflight_module
from inference.planning.memory import AvailableMemory, InsufficientMemory
from inference.planning.preflight import fit, preflight
from inference.serving.client import EmbeddedClient
from tests.inference.engine.fakes import engines_on


class RecordingFactory:
    """A runner factory that only records being asked: llama.cpp must never see these files."""

    def __init__(self):
        self.asked: list[str] = []

    def __call__(self, config):
        self.asked.append(config.model_path)
        raise AssertionError("the runner was asked to load")


def spec(path, **settings) -> ModelSpec:
    return ModelSpec("m", RunnerConfig(model_path=str(path), **settings), keep_alive=-1)


@pytest.fixture
def tiny_memory(monkeypatch):
    monkeypatch.setattr(
        preflight_module, "available_memory",
        lambda: AvailableMemory(ram_bytes=1 << 20, gpu_bytes=None),
    )  # fmt: skip


def test_a_corrupt_file_is_refused_before_llama_cpp_sees_it(corrupt_file):
    factory = RecordingFactory()
    host = EngineHost(engines_on(factory), preflight=fit)
    expected = str(pytest.raises(GGUFError, read_gguf, corrupt_file).value)

    with pytest.raises(GGUFError) as refused:
        host.load(spec(corrupt_file))

    assert str(refused.value) == expected
    assert factory.asked == [] and host.loaded() == [] and host.loading is None


def test_a_file_that_is_not_a_gguf_at_all_is_refused(tmp_path):
    text = tmp_path / "notes.gguf"
    text.write_text("these are not weights")
    with pytest.raises(GGUFError, match="magic|GGUF"):
        preflight(spec(text))


def test_a_load_that_cannot_fit_is_refused_with_the_numbers(starter_path, tiny_memory):
    factory = RecordingFactory()
    host = EngineHost(engines_on(factory), preflight=fit)

    with pytest.raises(InsufficientMemory) as refused:
        host.load(spec(starter_path, ctx_per_seq=2048, parallel=4))

    message = str(refused.value)
    # Weights (~94 MiB), the KV cache of 16384 tokens (2048 for each of 4 running and 4 cached
    # sequence slots; 30 layers x 3 KV heads x 64 x 2 x f16: 360 MiB) and what is free (1 MiB)
    # are all in the message.
    assert "needs" in message and "1 MiB of RAM is free" in message
    assert "KV cache 360 MiB" in message
    assert "weights 92 MiB" in message
    assert factory.asked == []


def test_a_load_that_fits_passes_with_its_estimate(starter_path):
    estimate = preflight(spec(starter_path, ctx_per_seq=1024, parallel=2, cache_slots=2))
    assert estimate.n_ctx_total == 4096  # one 1024-token KV stream per sequence slot
    assert estimate.kv_cache_bytes == 2 * 30 * 4096 * 3 * 64 * 2


def test_a_draft_model_counts_in_the_estimate(starter_path, tmp_path):
    from tests.inference.engine.draft_gguf import EMBED, LAYERS, write_draft

    draft = write_draft(tmp_path / "draft.gguf", starter_path)
    alone = preflight(spec(starter_path, ctx_per_seq=1024, parallel=2, cache_slots=0))
    both = preflight(spec(starter_path, ctx_per_seq=1024, parallel=2, cache_slots=0,
                          draft_model_path=str(draft)))  # fmt: skip
    assert both.weights_bytes == alone.weights_bytes + read_gguf(draft).weights_bytes
    # 1,024 cells a sequence for each of the 2 sequences, K and V, f16.
    assert both.kv_cache_bytes == alone.kv_cache_bytes + 2 * LAYERS * 2048 * EMBED * 2


def test_a_broken_draft_model_is_left_out_before_llama_cpp_sees_it(starter_path, corrupt_file):
    fitted = fit(spec(starter_path, ctx_per_seq=512, draft_model_path=str(corrupt_file)))
    assert fitted.config.draft_model_path == ""
    missing = fit(spec(starter_path, ctx_per_seq=512, draft_model_path="/nonexistent.gguf"))
    assert missing.config.draft_model_path == ""


def test_a_draft_model_that_would_not_fit_beside_the_model_is_left_out(
    starter_path, tmp_path, monkeypatch
):
    from tests.inference.engine.draft_gguf import write_draft

    draft = write_draft(tmp_path / "draft.gguf", starter_path)
    alone = preflight(spec(starter_path, ctx_per_seq=1024, parallel=2, cache_slots=0))
    room = AvailableMemory(ram_bytes=alone.total_bytes + (1 << 20), gpu_bytes=None)
    monkeypatch.setattr(preflight_module, "available_memory", lambda: room)
    fitted = fit(spec(starter_path, ctx_per_seq=1024, parallel=2, cache_slots=0,
                      draft_model_path=str(draft)))  # fmt: skip
    assert fitted.config.draft_model_path == "" and fitted.config.ctx_per_seq == 1024


def test_the_micro_batch_is_never_counted_larger_than_the_batch(starter_path):
    small = preflight(spec(starter_path, n_batch=64, n_ubatch=512))
    large = preflight(spec(starter_path, n_batch=512, n_ubatch=512))
    assert small.compute_bytes < large.compute_bytes


async def test_the_clients_host_refuses_the_load_with_the_numbers(starter_path, tiny_memory):
    client = EmbeddedClient()
    try:
        with pytest.raises(InsufficientMemory, match="of RAM is free"):
            await client.load(spec(starter_path))
        assert client.host.loaded() == []
    finally:
        client.host.shutdown()


def test_the_weights_of_models_already_loaded_do_not_count_as_free(starter_path, monkeypatch):
    """Their pages are mmapped cache, which the OS calls available; they are taken."""
    needed = preflight(spec(starter_path)).total_bytes
    monkeypatch.setattr(
        preflight_module, "available_memory",
        lambda: AvailableMemory(ram_bytes=needed + (50 << 20), gpu_bytes=None),
    )  # fmt: skip
    assert preflight(spec(starter_path)) is not None  # alone it fits
    with pytest.raises(InsufficientMemory, match="of RAM is free"):
        preflight(spec(starter_path), resident_bytes=100 << 20)


@pytest.mark.model
async def test_the_clients_host_checks_a_second_model_beside_the_first(
    starter_path, monkeypatch, settings
):
    settings.MAX_LOADED_MODELS = 2  # so the first stays loaded
    client = EmbeddedClient()
    try:
        await client.load(spec(starter_path))
        needed = preflight(spec(starter_path)).total_bytes
        monkeypatch.setattr(
            preflight_module, "available_memory",
            lambda: AvailableMemory(ram_bytes=needed + (50 << 20), gpu_bytes=None),
        )  # fmt: skip
        second = ModelSpec("second", spec(starter_path).config, keep_alive=-1)
        with pytest.raises(InsufficientMemory, match="of RAM is free"):
            await client.load(second)  # the first one's 98 MB of weights stay taken
    finally:
        client.host.shutdown()
