"""The models page's "derive a model": the derived model /api/create `from` makes, shown in the
registry table with its base; staff only."""

import pytest
from django.urls import reverse

from inference.catalog import spec_for
from inference.models import LLMModel
from tests.dashboard.model_pages.conftest import flashes

pytestmark = pytest.mark.django_db


def test_staff_derive_a_model_that_shares_its_bases_weights(staff, tiny_model, fake_engine):
    response = staff.post(reverse("models-derive"), {
        "name": "house-butler", "base": tiny_model.name, "system": "You are the butler.",
        "temperature": "0.2", "num_predict": "64",
    })  # fmt: skip
    assert response.status_code == 302
    derived = LLMModel.objects.get(name="house-butler")
    assert derived.base == tiny_model and derived.system_prompt == "You are the butler."
    assert derived.default_params == {"temperature": 0.2, "max_tokens": 64}
    assert spec_for(derived) == spec_for(tiny_model)
    page = staff.get(reverse("models")).content.decode()
    assert "derived from" in page and 'id="derive-form"' in page


def test_a_value_out_of_bounds_is_refused_with_its_reason(staff, tiny_model):
    response = staff.post(reverse("models-derive"), {
        "name": "too-hot", "base": tiny_model.name, "temperature": "50",
    })  # fmt: skip
    assert response.status_code == 302
    assert not LLMModel.objects.filter(name="too-hot").exists()
    assert any("temperature" in text for text in flashes(response))


def test_only_staff_may_derive(member_client, tiny_model):
    response = member_client.post(reverse("models-derive"), {"name": "x", "base": tiny_model.name})
    assert response.status_code == 403
    assert not LLMModel.objects.filter(name="x").exists()


def test_deleting_a_derived_model_from_its_page_keeps_the_base(staff, tiny_model, fake_engine):
    staff.post(reverse("models-derive"), {"name": "maid", "base": tiny_model.name})
    refused = staff.post(reverse("model-delete", args=[tiny_model.name]))
    assert LLMModel.objects.filter(pk=tiny_model.pk).exists(), refused
    staff.post(reverse("model-delete", args=["maid"]))
    assert not LLMModel.objects.filter(name="maid").exists()
    assert LLMModel.objects.filter(pk=tiny_model.pk).exists()


def test_a_derived_models_page_shows(staff, tiny_model, fake_engine):
    staff.post(reverse("models-derive"), {"name": "cook", "base": tiny_model.name})
    assert staff.get(reverse("model-detail", args=["cook"])).status_code == 200
