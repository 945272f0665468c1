"""A model's draft model on its page: one with the model's vocabulary is saved, reaches the
load and counts in the estimate; one that cannot draft for it is refused with the reason."""

import pytest
from django.urls import reverse

from inference.catalog.importing import register_file
from inference.catalog.specs import spec_for
from tests.inference.engine.draft_gguf import write_draft

from .test_settings_form import VALID, errors_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def target(starter_path):
    return register_file(starter_path, source="package", name="smollm2", hash_file=False)


@pytest.fixture
def draft(models_dir, starter_path):
    return register_file(write_draft(models_dir / "tiny-draft.gguf", starter_path),
                         source="scan", name="tiny-draft", hash_file=False)  # fmt: skip


def post(staff, model, **changes):
    return staff.post(reverse("model-detail", args=[model.name]), {**VALID, **changes})


def test_a_draft_model_with_the_same_vocabulary_is_saved_and_reaches_the_load(
    staff, target, draft
):
    before = post(staff, target)
    target.refresh_from_db()
    without = target.estimated_bytes
    response = post(staff, target, draft=draft.pk)
    assert before.status_code == response.status_code == 302
    target.refresh_from_db()
    assert target.draft == draft
    assert spec_for(target).config.draft_model_path == draft.file_path
    assert target.estimated_bytes > without + draft.size_bytes // 2  # its weights and its KV
    page = staff.get(reverse("model-detail", args=[target.name])).content.decode()
    assert f'<option value="{draft.pk}" selected>' in page


def test_no_draft_model_is_the_default_and_can_be_chosen_again(staff, target, draft):
    assert post(staff, target, draft=draft.pk).status_code == 302
    assert post(staff, target, draft="").status_code == 302
    target.refresh_from_db()
    assert target.draft is None and spec_for(target).config.draft_model_path == ""


@pytest.mark.parametrize("case, reason", [
    ("itself", "a model cannot be its own draft model"),
    ("larger", "it is not smaller than the model"),
    ("another tokenizer", "cannot draft for this model: it splits text into tokens differently"),
    ("other special tokens", "its beginning-of-text token differs"),
])  # fmt: skip
def test_a_draft_model_that_cannot_draft_is_refused_with_the_reason(
    staff, target, draft, tiny_model, models_dir, starter_path, case, reason
):
    odd = write_draft(models_dir / "odd-draft.gguf", starter_path, bos_token_id=5)
    other_bos = register_file(odd, source="scan", name="odd-draft", hash_file=False)
    model, chosen = {"itself": (target, target), "larger": (draft, target),
                     "another tokenizer": (target, tiny_model),
                     "other special tokens": (target, other_bos)}[case]  # fmt: skip
    response = post(staff, model, draft=chosen.pk, n_ctx=0)
    assert response.status_code == 400
    assert any(reason in e for e in errors_of(response)["draft"])
    model.refresh_from_db()
    assert model.draft is None
