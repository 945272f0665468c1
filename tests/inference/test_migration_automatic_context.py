"""Migration 0003: records holding the old import default, min(2048, training context), become
automatic (n_ctx 0); any other setting stays as someone saved it."""

import pytest

from tests.inference.migrating import latest, migrate

BEFORE = [("inference", "0002_pull")]
AFTER = [("inference", "0003_automatic_context")]


@pytest.mark.django_db(transaction=True)
def test_the_old_default_becomes_automatic_and_chosen_settings_stay():
    leaves = latest()
    try:
        old = migrate(BEFORE).get_model("inference", "LLMModel")
        for name, n_ctx, trained in [
            ("starter", 2048, 8192),
            ("tiny", 256, 256),
            ("chosen", 4096, 8192),
            ("unstated", 2048, None),
        ]:
            old.objects.create(name=name, file_path=f"/m/{name}.gguf", n_ctx=n_ctx,
                               context_length=trained)  # fmt: skip

        new = migrate(AFTER).get_model("inference", "LLMModel")
        settings = dict(new.objects.values_list("name", "n_ctx"))
        assert settings == {"starter": 0, "tiny": 0, "chosen": 4096, "unstated": 0}

        # And back: automatic becomes the old default again.
        back = migrate(BEFORE).get_model("inference", "LLMModel")
        assert dict(back.objects.values_list("name", "n_ctx")) == {
            "starter": 2048,
            "tiny": 256,
            "chosen": 4096,
            "unstated": 2048,
        }
    finally:
        migrate(leaves)
