"""A vision projector's header is checked before libmtmd reads it: each refusal says why."""

import pytest

from inference.gguf import read_gguf
from inference.gguf.projector import VISION_PROJECTORS, ProjectorError, check_projector
from tests.inference.gguf.conftest import EMBED
from tests.inference.ggufs import tiny_gguf
from tests.inference.projector_gguf import write_projector
from tests.inference.projectors import projector_variant


@pytest.fixture
def model(tmp_path):
    return tiny_gguf(tmp_path / "model.gguf")


def checked(path, n_embd=EMBED):
    return check_projector(read_gguf(path), n_embd)


def test_the_tiny_projector_passes_and_says_its_sizes(tmp_path, model):
    info = checked(write_projector(tmp_path / "mmproj.gguf", model))
    assert (info.projector_type, info.projection_dim) == ("mlp", EMBED)
    assert (info.image_size, info.patch_size, info.image_tokens) == (112, 14, 64)
    assert info.weights_bytes > 0 and info.encoder_compute_bytes > 0


def test_a_larger_image_size_needs_more_encoder_compute(tmp_path, model):
    small = checked(write_projector(tmp_path / "small.gguf", model))
    large = checked(write_projector(tmp_path / "large.gguf", model, image_size=224))
    assert large.image_tokens == 4 * small.image_tokens
    assert large.encoder_compute_bytes > 4 * small.encoder_compute_bytes


def test_the_projector_made_for_the_starter_passes_for_the_starter(tmp_path, starter_path):
    info = checked(write_projector(tmp_path / "mmproj.gguf", starter_path), 576)
    assert info.projection_dim == 576


def test_a_language_model_is_not_a_projector(model):
    with pytest.raises(ProjectorError, match="not 'clip'"):
        checked(model)


@pytest.mark.parametrize(("drop", "change", "reason"), [
    (("clip.has_vision_encoder",), {}, "no vision encoder"),
    ((), {"clip.has_vision_encoder": False}, "no vision encoder"),
    (("clip.projector_type",), {}, "does not say its projector type"),
    ((), {"clip.projector_type": "qwen2a"}, "encodes audio, not images"),
    ((), {"clip.projector_type": "hologram"}, "'hologram' is not one this llama.cpp knows"),
    (("clip.vision.projection_dim",), {}, "does not state clip.vision.projection_dim"),
    ((), {"clip.vision.image_size": 100_000}, "image_size 100000 is outside 16..4096"),
    ((), {"clip.vision.patch_size": 0}, "patch_size 0 is outside 1..64"),
    ((), {"clip.vision.block_count": 1000}, "block_count 1000 is outside 1..128"),
    ((), {"clip.vision.embedding_length": 1 << 20}, "embedding_length 1048576 is outside"),
    (("clip.vision.image_size",), {}, "does not state clip.vision.image_size"),
])  # fmt: skip
def test_a_projector_with_a_bad_header_is_refused_with_its_reason(
    tmp_path, model, drop, change, reason
):
    path = projector_variant(tmp_path / "mmproj.gguf", model, drop=drop, change=change)
    with pytest.raises(ProjectorError, match=reason):
        checked(path)


def test_a_projector_made_for_another_width_is_refused(tmp_path, model):
    path = write_projector(tmp_path / "mmproj.gguf", model, n_embd=2 * EMBED)
    with pytest.raises(ProjectorError, match=f"is {2 * EMBED}, but the language model's "
                       f"embedding width is {EMBED}"):  # fmt: skip
        checked(path)


def test_a_projector_whose_last_tensor_disagrees_with_its_stated_width_is_refused(
    tmp_path, model
):
    path = projector_variant(tmp_path / "mmproj.gguf", model, n_embd=2 * EMBED,
                             change={"clip.vision.projection_dim": EMBED})  # fmt: skip
    with pytest.raises(ProjectorError, match=f"mm.2.weight puts out {2 * EMBED} values"):
        checked(path)


def test_without_a_model_to_fit_the_width_is_not_checked(tmp_path, model):
    path = write_projector(tmp_path / "mmproj.gguf", model, n_embd=2 * EMBED)
    assert checked(path, None).projection_dim == 2 * EMBED


def test_the_table_holds_the_vision_types_of_the_pinned_llama_cpp():
    assert {"mlp", "idefics3", "gemma3", "qwen2.5vl_merger", "pixtral"} <= set(VISION_PROJECTORS)
    assert "ultravox" not in VISION_PROJECTORS
