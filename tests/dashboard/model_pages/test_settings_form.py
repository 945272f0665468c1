"""A model's settings form: bounds with clear errors that name the field, and a saved change
that updates the estimate."""

import pytest
from django.urls import reverse

from tests.dashboard.model_pages.conftest import flashes

pytestmark = pytest.mark.django_db

VALID = {
    "n_ctx": 256, "n_gpu_layers": -1, "n_threads": 2, "n_batch": 512, "n_ubatch": 256,
    "kv_type": "f16", "parallel": 2, "speculative": "auto", "keep_alive": "10m",
    "system_prompt": "Be brief.",
    "sampling_temperature": "0.2", "sampling_top_k": "20", "chat_template_override": "",
}  # fmt: skip


def post(staff, model, **changes):
    return staff.post(reverse("model-detail", args=[model.name]), {**VALID, **changes})


def errors_of(response) -> dict[str, list[str]]:
    return {name: list(errs) for name, errs in response.context["form"].errors.items()}


def test_valid_settings_are_saved_and_the_estimate_follows(staff, tiny_model):
    before = tiny_model.estimated_bytes
    response = post(staff, tiny_model)

    assert response.status_code == 302
    assert flashes(response) == [f"Settings of {tiny_model.name} saved; they apply when it loads."]
    tiny_model.refresh_from_db()
    assert (tiny_model.n_ctx, tiny_model.parallel, tiny_model.n_threads) == (256, 2, 2)
    assert tiny_model.default_params == {"temperature": 0.2, "top_k": 20}
    assert tiny_model.keep_alive == "10m" and tiny_model.system_prompt == "Be brief."
    assert tiny_model.estimated_bytes < before  # 2 sequences' KV cache instead of 4


def test_a_context_of_0_is_saved_as_automatic(staff, tiny_model):
    response = post(staff, tiny_model, n_ctx=0)

    assert response.status_code == 302
    tiny_model.refresh_from_db()
    assert tiny_model.n_ctx == 0


@pytest.mark.parametrize("changes, field, message", [
    ({"n_ctx": 512}, "n_ctx", "less than or equal to 256"),
    ({"n_ctx": 100}, "n_ctx", "must be 0 (automatic) or at least 256"),
    ({"n_ctx": -1}, "n_ctx", "greater than or equal to 0"),
    ({"n_gpu_layers": -2}, "n_gpu_layers", "greater than or equal to -1"),
    ({"n_gpu_layers": 1001}, "n_gpu_layers", "less than or equal to 1000"),
    ({"n_threads": 257}, "n_threads", "less than or equal to 256"),
    ({"n_batch": 16}, "n_batch", "greater than or equal to 32"),
    ({"n_batch": 9000}, "n_batch", "less than or equal to 8192"),
    ({"n_batch": 128, "n_ubatch": 256}, "n_ubatch", "must be at most n_batch (128)"),
    ({"parallel": 0}, "parallel", "greater than or equal to 1"),
    ({"parallel": 17}, "parallel", "less than or equal to 16"),
    ({"kv_type": "q8_0"}, "kv_type", "needs flash attention"),
    ({"kv_type": "q2"}, "kv_type", "Select a valid choice"),
    ({"keep_alive": "soon"}, "keep_alive", "keep_alive must be a duration"),
    ({"speculative": "always"}, "speculative", "Select a valid choice"),  # the box's, not a model's
    ({"speculative": ""}, "speculative", "This field is required"),
    ({"sampling_temperature": "9"}, "sampling_temperature", "less than or equal to 5.0"),
    ({"sampling_temperature": "-0.1"}, "sampling_temperature", "greater than or equal to 0.0"),
    ({"sampling_top_p": "1.5"}, "sampling_top_p", "less than or equal to 1.0"),
    ({"sampling_min_p": "nan"}, "sampling_min_p", "Enter a number"),
    ({"sampling_top_k": "many"}, "sampling_top_k", "Enter a whole number"),
    ({"sampling_top_k": "100001"}, "sampling_top_k", "less than or equal to 100000"),
    ({"sampling_repeat_penalty": "6"}, "sampling_repeat_penalty", "less than or equal to 5.0"),
    ({"sampling_max_tokens": "0"}, "sampling_max_tokens", "greater than or equal to 1"),
    ({"sampling_stop": "x" * 257}, "sampling_stop", "each stop string must be 1 to 256"),
    ({"sampling_stop": "\n".join(f"s{i}" for i in range(17))}, "sampling_stop",
     "at most 16 stop strings"),
    ({"chat_template_override": "{% for m in messages %}"}, "chat_template_override",
     "the template cannot render a conversation"),
    ({"chat_template_override": "{{ ''.__class__.__mro__ }}"}, "chat_template_override",
     "the template cannot render a conversation"),
    ({"chat_template_override": "hello"}, "chat_template_override",
     "leaves the messages out"),
])  # fmt: skip
def test_a_bad_setting_is_refused_with_an_error_on_its_field(
    staff, tiny_model, changes, field, message
):
    response = post(staff, tiny_model, **changes)

    assert response.status_code == 400
    errors = errors_of(response)
    assert any(message in text for text in errors.get(field, [])), errors
    tiny_model.refresh_from_db()
    assert tiny_model.n_threads == 0 and tiny_model.default_params == {}  # nothing saved


def test_a_quantised_kv_cache_with_flash_attention_is_accepted(staff, tiny_model):
    assert post(staff, tiny_model, kv_type="q8_0", flash_attn="on").status_code == 302
    tiny_model.refresh_from_db()
    assert tiny_model.kv_type == "q8_0" and tiny_model.flash_attn


def test_a_chat_template_override_that_renders_is_kept(staff, tiny_model):
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    assert post(staff, tiny_model, chat_template_override=template).status_code == 302
    tiny_model.refresh_from_db()
    assert tiny_model.effective_chat_template == template


def test_the_errors_are_shown_on_the_page(staff, tiny_model):
    page = post(staff, tiny_model, n_ctx=999999).content.decode()
    assert "less than or equal to 256" in page and 'class="errorlist' in page


def test_default_sampling_is_a_small_form_that_keeps_what_it_has_no_field_for(staff, tiny_model):
    tiny_model.default_params = {"seed": 7, "temperature": 0.9}
    tiny_model.save()
    page = staff.get(reverse("model-detail", args=[tiny_model.name])).content.decode()
    assert 'name="sampling_temperature"' in page and 'value="0.9"' in page
    assert 'name="default_params"' not in page  # no raw JSON box
    assert 'max="5.0"' in page and 'min="0.0"' in page  # the engine's bounds, in the browser too

    response = post(staff, tiny_model, sampling_temperature="", sampling_top_p="0.8",
                    sampling_max_tokens="2048", sampling_stop="User:\r\n\r\n###\r\n")
    assert response.status_code == 302
    tiny_model.refresh_from_db()
    # An emptied field goes back to the engine's default; seed has no field and stays.
    assert tiny_model.default_params == {
        "seed": 7, "top_k": 20, "top_p": 0.8, "max_tokens": 2048, "stop": ["User:", "###"],
    }
    page = staff.get(reverse("model-detail", args=[tiny_model.name])).content.decode()
    assert "User:\n###</textarea>" in page


def test_speculation_can_be_turned_off_for_one_model_and_it_reaches_its_load(staff, tiny_model):
    from inference.catalog.specs import spec_for

    page = staff.get(reverse("model-detail", args=[tiny_model.name])).content.decode()
    assert 'name="speculative"' in page and "SPECULATIVE_DECODING=off" in page
    assert post(staff, tiny_model, speculative="off").status_code == 302
    tiny_model.refresh_from_db()
    assert tiny_model.speculative == "off"
    assert spec_for(tiny_model).config.speculative == "off"  # what the runner is started with
