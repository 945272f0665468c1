"""An inference worker finds a model's draft model by its digest, as it finds the model: in its
own models directory, wherever the web side's path pointed; a box without a copy loads the
model without a draft."""

import hashlib

from inference.engine.host import ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.serving.model_index import ModelIndex
from inference.serving.worker_state import WorkerRuntime


def worker_with(models) -> WorkerRuntime:
    state = WorkerRuntime.__new__(WorkerRuntime)  # only its index matters here: no Redis, no runner
    state.name, state.index = "box-2", ModelIndex([models])
    return state


def spec(draft_path: str, draft_sha256: str) -> ModelSpec:
    config = RunnerConfig(model_path="/web/models/big.gguf", draft_model_path=draft_path)
    return ModelSpec("big", config, draft_sha256=draft_sha256)


def test_the_draft_is_this_boxs_own_copy_found_by_its_digest(tmp_path):
    data = b"GGUF a draft model's bytes"
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "small.gguf").write_bytes(data)
    digest = hashlib.sha256(data).hexdigest()
    local = worker_with(tmp_path / "models").local_spec(spec("/web/models/draft.gguf", digest))
    assert local.config.draft_model_path == str(tmp_path / "models" / "small.gguf")
    assert local.config.model_path == "/web/models/big.gguf"  # no digest: the path as sent


def test_a_box_without_the_draft_loads_the_model_without_one(tmp_path):
    (tmp_path / "models").mkdir()
    local = worker_with(tmp_path / "models").local_spec(spec("/web/models/draft.gguf", "a" * 64))
    assert local.config.draft_model_path == ""


def test_the_draft_digest_crosses_the_wire_and_a_bad_one_is_refused():
    sent = spec("/web/models/draft.gguf", "B" * 64)
    assert ModelSpec.from_wire(sent.to_wire()).draft_sha256 == "b" * 64
    wire = {**sent.to_wire(), "draft_sha256": "not a digest"}
    try:
        ModelSpec.from_wire(wire)
    except ValueError as exc:
        assert "draft_sha256" in str(exc)
    else:
        raise AssertionError("a bad digest was accepted")
