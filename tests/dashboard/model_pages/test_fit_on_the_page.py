"""The model page's estimate says what the load's fit will choose on this box, and why."""

from django.urls import reverse

from tests.inference.planning.nvml import h200, installed


def test_on_a_box_with_a_card_the_estimate_says_how_the_model_was_fitted_to_it(
    staff, tiny_model, monkeypatch
):
    installed(monkeypatch, h200())
    page = staff.get(reverse("model-detail", args=[tiny_model.name])).content.decode()
    assert "Fitted: fitted to the GPU (140.4 GiB free, less a 1.0 GiB margin): 256 tokens per " \
        "sequence (the training context), KV cache f16, every layer on the GPU" in page


def test_without_a_card_it_says_why_the_automatic_context_is_what_it_is(
    staff, tiny_model, monkeypatch
):
    installed(monkeypatch)
    page = staff.get(reverse("model-detail", args=[tiny_model.name])).content.decode()
    assert "Fitted: automatic context: 256 tokens per sequence (the training context)" in page
