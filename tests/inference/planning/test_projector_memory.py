"""A vision projector in the preflight: its weights and its encoder's compute count in the
estimate (on the GPU where the model's layers go), a load that cannot fit them is refused, and
a projector that does not fit the model is refused before llama.cpp or libmtmd sees it."""

import dataclasses

import pytest

from inference.engine.host import EngineHost, ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.gguf import read_gguf
from inference.gguf.projector import ProjectorError, check_projector
from inference.planning import preflight as preflight_module
from inference.planning.memory import AvailableMemory, InsufficientMemory, with_projector
from inference.planning.preflight import estimate_for_config, fit, preflight
from tests.inference.engine.fakes import engines_on
from tests.inference.planning.test_preflight import RecordingFactory
from tests.inference.projector_gguf import write_projector


def spec(path, **settings) -> ModelSpec:
    return ModelSpec("m", RunnerConfig(model_path=str(path), **settings), keep_alive=-1)


@pytest.fixture(scope="module")
def mmproj(starter_path, tmp_path_factory):
    return write_projector(tmp_path_factory.mktemp("vl") / "mmproj.gguf", starter_path)


def test_the_projector_adds_its_weights_and_encoder_compute(starter_path, mmproj):
    settings = {"ctx_per_seq": 512, "parallel": 1, "cache_slots": 0, "n_gpu_layers": 0}
    alone = preflight(spec(starter_path, **settings))
    seeing = preflight(spec(starter_path, mmproj_path=str(mmproj), **settings))
    projector = check_projector(read_gguf(mmproj), 576)
    assert seeing.weights_bytes == alone.weights_bytes + projector.weights_bytes
    assert seeing.compute_bytes == alone.compute_bytes + projector.encoder_compute_bytes
    assert seeing.kv_cache_bytes == alone.kv_cache_bytes
    assert seeing.gpu_bytes == 0  # CPU only: all of it in RAM


def test_with_layers_on_the_gpu_the_projector_goes_there_too(starter_path, mmproj):
    config = RunnerConfig(model_path=str(starter_path), ctx_per_seq=512, parallel=1,
                          cache_slots=0, n_gpu_layers=-1)  # fmt: skip
    info = read_gguf(starter_path)
    alone = estimate_for_config(info, config)
    seeing = estimate_for_config(info, dataclasses.replace(config, mmproj_path=str(mmproj)))
    projector = check_projector(read_gguf(mmproj), 576)
    added = projector.weights_bytes + projector.encoder_compute_bytes
    assert seeing.gpu_bytes == alone.gpu_bytes + added
    assert with_projector(dataclasses.replace(alone, gpu_weights_bytes=0, gpu_kv_cache_bytes=0,
                                              gpu_compute_bytes=0), projector).gpu_bytes == 0


def test_a_load_that_cannot_fit_the_projector_is_refused(starter_path, mmproj, monkeypatch):
    settings = {"ctx_per_seq": 512, "parallel": 1, "cache_slots": 0, "n_gpu_layers": 0}
    alone = preflight(spec(starter_path, **settings))
    # Room for the model alone, not for its projector's encoder as well.
    room = alone.total_bytes + 1024
    monkeypatch.setattr(preflight_module, "available_memory",
                        lambda: AvailableMemory(ram_bytes=room, gpu_bytes=None))  # fmt: skip
    preflight(spec(starter_path, **settings))
    with pytest.raises(InsufficientMemory, match="of RAM is free"):
        preflight(spec(starter_path, mmproj_path=str(mmproj), **settings))


def test_a_projector_for_another_model_is_refused_before_anything_loads(starter_path, tmp_path):
    wrong = write_projector(tmp_path / "mmproj.gguf", starter_path, n_embd=960)
    factory = RecordingFactory()
    host = EngineHost(engines_on(factory), preflight=fit)
    with pytest.raises(ProjectorError, match="is 960, but the language model's embedding width "
                       "is 576"):  # fmt: skip
        host.load(spec(starter_path, ctx_per_seq=512, mmproj_path=str(wrong)))
    assert factory.asked == [] and host.loaded() == []
