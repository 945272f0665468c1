"""Uploads through the real view: streamed into the models directory, validated before they
become a model file, and never leaving a file behind when refused."""

import hashlib

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from inference.models import Job, LLMModel

pytestmark = pytest.mark.django_db


def upload(client, filename: str, data: bytes, *, json: bool = True, **fields):
    headers = {"Accept": "application/json"} if json else {}
    return client.post(
        reverse("models-upload"),
        {"file": SimpleUploadedFile(filename, data, "application/octet-stream"), **fields},
        headers=headers,
    )


def test_an_uploaded_gguf_is_moved_into_the_models_directory_and_registered(
    staff, models_dir, outside_file
):
    data = outside_file.read_bytes()
    response = upload(staff, "My-Model.Q8_0.gguf", data)

    assert response.status_code == 201
    answer = response.json()
    model = LLMModel.objects.get(name=answer["name"])
    assert answer["url"] == reverse("model-detail", args=[model.name])
    assert model.name == "my-model-q8_0" and model.source == LLMModel.Source.UPLOAD
    assert model.file_path == str(models_dir / "My-Model.Q8_0.gguf")
    assert (models_dir / "My-Model.Q8_0.gguf").read_bytes() == data
    assert sorted(p.name for p in models_dir.iterdir()) == ["My-Model.Q8_0.gguf"]
    job = Job.objects.get(pk=answer["hash_job"])
    assert job.kind == Job.Kind.HASH and job.model == model

    from inference.catalog.importing import hash_model_job

    assert hash_model_job(job.id) == hashlib.sha256(data).hexdigest()


def test_a_form_upload_redirects_to_the_models_page(staff, models_dir, outside_file):
    response = upload(staff, "plain.gguf", outside_file.read_bytes(), json=False, name="chosen")
    assert response.status_code == 302
    assert response["Location"] == reverse("model-detail", args=["chosen"])


def test_a_corrupt_upload_is_refused_and_leaves_no_file_behind(staff, models_dir, corrupt_file):
    response = upload(staff, "broken.gguf", corrupt_file.read_bytes())

    assert response.status_code == 400
    assert "broken.gguf is not a usable GGUF file" in response.json()["error"]
    assert list(models_dir.iterdir()) == []
    assert LLMModel.objects.count() == 0


def test_an_upload_that_is_not_a_gguf_is_refused(staff, models_dir):
    response = upload(staff, "model.gguf", b"<html>not a model</html>" * 10)
    assert response.status_code == 400 and "not a usable GGUF file" in response.json()["error"]
    assert list(models_dir.iterdir()) == []


def test_an_upload_with_a_taken_name_is_refused_and_leaves_no_file(staff, tiny_model, models_dir,
                                                                   outside_file):  # fmt: skip
    before = sorted(p.name for p in models_dir.iterdir())
    response = upload(staff, "other.gguf", outside_file.read_bytes(), name=tiny_model.name)
    assert response.status_code == 400 and "already registered" in response.json()["error"]
    assert sorted(p.name for p in models_dir.iterdir()) == before


def test_an_upload_without_a_file_is_refused(staff, models_dir):
    response = staff.post(reverse("models-upload"), {"name": "x"},
                          headers={"Accept": "application/json"})  # fmt: skip
    assert response.status_code == 400 and "required" in response.json()["error"]


def test_a_path_in_the_file_name_cannot_escape_the_models_directory(staff, models_dir, outside_file,
                                                                    tmp_path):  # fmt: skip
    response = upload(staff, "../../evil.gguf", outside_file.read_bytes())
    assert response.status_code == 201
    assert (models_dir / "evil.gguf").exists()
    assert not (tmp_path / "evil.gguf").exists()


def test_an_upload_refused_for_its_csrf_token_leaves_no_partial_file(admin_user, models_dir,
                                                                    outside_file):  # fmt: skip
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(admin_user)
    response = upload(browser, "m.gguf", outside_file.read_bytes())
    assert response.status_code == 403
    assert list(models_dir.iterdir()) == []
