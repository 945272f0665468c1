"""An inference worker finds a vision model's projector by its digest, as it finds the model: in
its own models directory, wherever the web side's path pointed. The projector is part of the
model: a box without a copy of it does not have the model."""

import hashlib

import pytest

from inference.engine.host import ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.serving.worker_state import NoCopy
from tests.inference.serving.test_local_drafts import worker_with


def spec(mmproj_sha256: str) -> ModelSpec:
    config = RunnerConfig(model_path="/web/models/vl.gguf", mmproj_path="/web/models/mmproj.gguf")
    return ModelSpec("vl", config, mmproj_sha256=mmproj_sha256)


def test_the_projector_is_this_boxs_own_copy_found_by_its_digest(tmp_path):
    data = b"GGUF a projector's bytes"
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "mmproj-f16.gguf").write_bytes(data)
    local = worker_with(tmp_path / "models").local_spec(spec(hashlib.sha256(data).hexdigest()))
    assert local.config.mmproj_path == str(tmp_path / "models" / "mmproj-f16.gguf")


def test_a_box_without_the_projector_does_not_have_the_model(tmp_path):
    (tmp_path / "models").mkdir()
    with pytest.raises(NoCopy, match="no copy of vl's vision projector"):
        worker_with(tmp_path / "models").local_spec(spec("c" * 64))


def test_the_projector_digest_crosses_the_wire_and_a_bad_one_is_refused():
    sent = spec("D" * 64)
    assert ModelSpec.from_wire(sent.to_wire()).mmproj_sha256 == "d" * 64
    with pytest.raises(ValueError, match="mmproj_sha256"):
        ModelSpec.from_wire({**sent.to_wire(), "mmproj_sha256": "not a digest"})
    assert ModelSpec.from_wire(sent.to_wire()).config.mmproj_path == "/web/models/mmproj.gguf"
