"""The models page's "derive a model": the derived model /api/create `from` makes, shown in the
registry table with its base; staff only."""

import pytest
from django.urls import reverse

from inference.catalog.specs import spec_for
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


def derived(base, name: str = "cook", **fields) -> LLMModel:
    from inference.catalog import creating

    return creating.derive(base, name, **fields)


def test_a_derived_models_page_shows_its_own_settings_and_links_its_base_for_the_rest(
    staff, tiny_model, fake_engine
):
    tiny_model.default_params = {"temperature": 0.3}
    tiny_model.save()
    derived(tiny_model, system="You cook.", parameters={"top_k": 12},
            messages=[{"role": "user", "content": "What is for dinner?"},
                      {"role": "assistant", "content": "Soup."}])  # fmt: skip
    response = staff.get(reverse("model-detail", args=["cook"]))
    page = response.content.decode()
    assert response.status_code == 200
    base_url = reverse("model-detail", args=[tiny_model.name])
    assert f'href="{base_url}"' in page and "load settings" in page
    form = response.context["form"]
    assert set(form.fields) >= {"system_prompt", "chat_template_override", "sampling_top_k"}
    assert not set(form.fields) & {"n_ctx", "n_gpu_layers", "parallel", "kv_type", "keep_alive"}
    assert "Memory" not in page and "Runner process" not in page
    assert form["system_prompt"].value() == "You cook." and form["sampling_top_k"].value() == 12
    # An empty field means the base's default, and says so.
    temperature = form.fields["sampling_temperature"]
    assert temperature.widget.attrs["placeholder"] == "0.3"
    assert f"from {tiny_model.name}" in temperature.help_text
    assert "What is for dinner?" in page and "Soup." in page  # its seed messages


def test_staff_save_a_derived_models_own_settings_and_nothing_of_its_bases(
    staff, tiny_model, fake_engine
):
    model = derived(tiny_model)
    response = staff.post(reverse("model-detail", args=["cook"]), {
        "system_prompt": "Short answers.", "chat_template_override": "",
        "sampling_temperature": "0.4", "n_ctx": "300", "parallel": "1",
    })  # fmt: skip
    assert response.status_code == 302
    assert flashes(response) == ["Settings of cook saved; they apply to its next answer."]
    model.refresh_from_db()
    tiny_model.refresh_from_db()
    assert model.system_prompt == "Short answers." and model.default_params == {"temperature": 0.4}
    assert (model.n_ctx, tiny_model.n_ctx) == (tiny_model.n_ctx, tiny_model.n_ctx)
    assert spec_for(model) == spec_for(tiny_model)  # still loads as its base


def test_a_bad_setting_of_a_derived_model_is_a_400_naming_it(staff, tiny_model, fake_engine):
    derived(tiny_model)
    response = staff.post(reverse("model-detail", args=["cook"]),
                          {"system_prompt": "", "sampling_temperature": "9"})  # fmt: skip
    assert response.status_code == 400
    assert "sampling_temperature" in response.context["form"].errors


def test_a_member_reads_a_derived_models_settings_without_a_form(
    member_client, tiny_model, fake_engine
):
    derived(tiny_model, system="You cook.", parameters={"top_k": 12})
    page = member_client.get(reverse("model-detail", args=["cook"])).content.decode()
    assert "You cook." in page and "top_k 12" in page and 'id="settings-form"' not in page
