"""A model's vision projector on its page: chosen from the projector files or uploaded, checked
against the model (refused with the reason), shown, reaching the load and the estimate."""

import pytest
from django.contrib.messages import get_messages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from inference.catalog.importing import register_file
from inference.catalog.projectors import register_projector
from inference.catalog.specs import spec_for
from inference.models import LLMModel, Projector
from tests.inference.projectors import projector_at

from .test_settings_form import VALID, errors_of

pytestmark = pytest.mark.django_db


@pytest.fixture
def fitting(models_dir, tiny_model):
    path = projector_at(models_dir / "mmproj-tiny.gguf", tiny_model.file_path)
    return register_projector(path, source="scan", n_embd=None)


@pytest.fixture
def other_width(models_dir, tiny_model):
    path = projector_at(models_dir / "mmproj-wide.gguf", tiny_model.file_path, n_embd=128)
    return register_projector(path, source="scan", n_embd=None)


def post(staff, model, **changes):
    return staff.post(reverse("model-detail", args=[model.name]), {**VALID, **changes})


def page(staff, model) -> str:
    return staff.get(reverse("model-detail", args=[model.name])).content.decode()


def test_a_projector_chosen_on_the_page_is_saved_shown_and_reaches_the_load(
    staff, tiny_model, fitting
):
    assert post(staff, tiny_model).status_code == 302
    tiny_model.refresh_from_db()
    without = tiny_model.estimated_bytes
    assert post(staff, tiny_model, projector=fitting.pk).status_code == 302
    tiny_model.refresh_from_db()
    assert tiny_model.projector == fitting and tiny_model.load_settings_changed_at
    assert spec_for(tiny_model).config.mmproj_path == fitting.file_path
    assert tiny_model.estimated_bytes > without + fitting.size_bytes // 2
    shown = page(staff, tiny_model)
    assert f'<option value="{fitting.pk}" selected>' in shown
    assert "mlp, images of 112 px in 14 px patches" in shown

    assert post(staff, tiny_model, projector="").status_code == 302  # text only again
    tiny_model.refresh_from_db()
    assert tiny_model.projector is None and spec_for(tiny_model).config.mmproj_path == ""
    assert "none: it takes text only" in page(staff, tiny_model)


def test_a_projector_made_for_another_model_is_refused_with_the_reason(
    staff, tiny_model, other_width
):
    response = post(staff, tiny_model, projector=other_width.pk)
    assert response.status_code == 400
    (error,) = errors_of(response)["projector"]
    assert "mmproj-wide.gguf cannot serve this model" in error
    assert "projection width (clip.vision.projection_dim) is 128" in error
    tiny_model.refresh_from_db()
    assert tiny_model.projector is None


def test_a_second_text_only_entry_of_one_file_is_refused(staff, tiny_model, fitting):
    looker = register_file(tiny_model.file_path, source="scan", name="looker", projector=fitting)
    response = post(staff, looker, projector="")
    assert response.status_code == 400
    assert errors_of(response)["projector"] == [
        f"{tiny_model.name} is this file without a projector already"]  # fmt: skip


def test_an_uploaded_projector_is_checked_kept_and_used(staff, models_dir, tmp_path, tiny_model):
    data = projector_at(tmp_path / "up" / "mmproj-up.gguf", tiny_model.file_path).read_bytes()
    response = staff.post(reverse("model-projector", args=[tiny_model.name]),
                          {"file": SimpleUploadedFile("mmproj-up.gguf", data)})  # fmt: skip
    assert response.status_code == 302
    tiny_model.refresh_from_db()
    assert tiny_model.projector.file_path == str(models_dir / "mmproj-up.gguf")
    assert (models_dir / "mmproj-up.gguf").read_bytes() == data
    assert len(tiny_model.projector.sha256) == 64
    assert [m.message for m in get_messages(response.wsgi_request)] == [
        f"{tiny_model.name} takes images now, with mmproj-up.gguf; it applies when it loads."]
    assert not [p for p in models_dir.iterdir() if p.name.startswith(".")]  # no partial left


def test_an_uploaded_projector_that_does_not_fit_is_removed_with_the_reason(
    staff, models_dir, tmp_path, tiny_model
):
    wrong = projector_at(tmp_path / "up" / "mmproj.gguf", tiny_model.file_path, n_embd=128)
    response = staff.post(reverse("model-projector", args=[tiny_model.name]),
                          {"file": SimpleUploadedFile("mmproj.gguf", wrong.read_bytes())})
    assert response.status_code == 302
    (message,) = [m.message for m in get_messages(response.wsgi_request)]
    assert "mmproj.gguf was not added" in message and "projection width" in message
    assert Projector.objects.count() == 0
    assert sorted(p.name for p in models_dir.iterdir()) == ["Tiny-Chat.Q8_0.gguf"]
    tiny_model.refresh_from_db()
    assert tiny_model.projector is None


def test_only_staff_may_upload_a_projector(member_client, tiny_model):
    response = member_client.post(reverse("model-projector", args=[tiny_model.name]),
                                  {"file": SimpleUploadedFile("m.gguf", b"GGUF")})  # fmt: skip
    assert response.status_code in (302, 403)
    assert LLMModel.objects.get().projector is None


def test_the_models_list_marks_the_models_that_take_images(staff, tiny_model, fitting):
    register_file(tiny_model.file_path, source="scan", name="looker", projector=fitting)
    page = staff.get(reverse("models")).content.decode()
    assert page.count('title="loads with a vision projector: it takes images">vision<') == 1
