"""Migration 0011: a model registered before fill-in-the-middle tokens were recorded gets them
read from its header once, so a code model imported then lists "insert" without a rescan."""

import pytest

from tests.inference.migrating import latest, migrate

BEFORE = [("inference", "0010_projector")]
AFTER = [("inference", "0011_fim_tokens")]


@pytest.mark.model
@pytest.mark.django_db(transaction=True)
def test_models_registered_before_get_their_fim_tokens_from_their_headers(
    code_model_path, starter_path, tmp_path
):
    leaves = latest()
    try:
        old = migrate(BEFORE).get_model("inference", "LLMModel")
        for name, path in [("coder", code_model_path), ("chat", starter_path),
                           ("gone", tmp_path / "gone.gguf")]:  # fmt: skip
            old.objects.create(name=name, file_path=str(path), metadata={"bos_token": "x"})

        new = migrate(AFTER).get_model("inference", "LLMModel")
        metadata = dict(new.objects.values_list("name", "metadata"))
        found = {role: token["id"] for role, token in metadata["coder"]["fim"].items()}
        assert found.items() >= {"pre": 8, "suf": 9, "mid": 10}.items()
        assert metadata["coder"]["bos_token"] == "x"  # the rest of what was recorded stays
        assert not {"pre", "suf", "mid"} & metadata["chat"]["fim"].keys()  # read, and none
        assert "fim" not in metadata["gone"]  # a file that is gone is left as it was
    finally:
        migrate(leaves)
