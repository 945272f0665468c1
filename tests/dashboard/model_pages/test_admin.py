"""The Django admin: models with their loaded state (hidden ones too), jobs, request records
(read-only), conversations, and API keys whose hash cannot be edited."""

import pytest
from django.urls import reverse

from dashboard.models import ApiKey
from inference.catalog.operations import unregister
from inference.models import Job, RequestRecord

pytestmark = pytest.mark.django_db


def test_the_model_list_shows_loaded_state_and_hidden_models(staff, tiny_model, fake_engine,
                                                             starter_path):  # fmt: skip
    from inference.catalog.importing import register_packaged_models

    (packaged,) = register_packaged_models()
    unregister(packaged)
    staff.post(reverse("model-load", args=[tiny_model.name]))

    page = staff.get(reverse("admin:inference_llmmodel_changelist")).content.decode()

    assert tiny_model.name in page and packaged.name in page
    assert 'alt="True"' in page  # the loaded column's icon for the tiny model


def test_a_models_header_fields_are_read_only(staff, tiny_model):
    page = staff.get(reverse("admin:inference_llmmodel_change", args=[tiny_model.pk]))
    assert page.status_code == 200
    content = page.content.decode()
    assert 'name="n_ctx"' in content and 'name="sha256"' not in content


def test_jobs_and_request_records_are_listed_and_records_cannot_be_edited(staff):
    Job.objects.create(kind=Job.Kind.HASH, source="/m.gguf", progress=0.5)
    record = RequestRecord.objects.create(request_id="r1", model_name="m", source="chat",
                                          outcome="stop")  # fmt: skip
    assert "50%" in staff.get(reverse("admin:inference_job_changelist")).content.decode()
    assert staff.get(reverse("admin:inference_requestrecord_changelist")).status_code == 200
    change = staff.get(reverse("admin:inference_requestrecord_change", args=[record.pk]))
    assert 'name="model_name"' not in change.content.decode()
    assert staff.get(reverse("admin:inference_requestrecord_add")).status_code == 403


def test_api_keys_show_the_hash_read_only_and_cannot_be_added_here(staff):
    key, raw = ApiKey.create("home-assistant")
    page = staff.get(reverse("admin:dashboard_apikey_change", args=[key.pk])).content.decode()
    assert key.key_hash in page and 'name="key_hash"' not in page and raw not in page
    assert staff.get(reverse("admin:dashboard_apikey_add")).status_code == 403
    staff.post(reverse("admin:dashboard_apikey_changelist"),
               {"action": "revoke", "_selected_action": [key.pk]})  # fmt: skip
    key.refresh_from_db()
    assert key.revoked


def test_conversations_are_in_the_admin(staff, admin_user):
    from dashboard.models import Conversation

    Conversation.objects.create(user=admin_user, title="Soup recipes")
    page = staff.get(reverse("admin:dashboard_conversation_changelist")).content.decode()
    assert "Soup recipes" in page


def test_the_admin_lists_projectors_read_only(staff, models_dir, tiny_model):
    from inference.catalog.projectors import register_projector
    from tests.inference.projectors import projector_at

    projector = register_projector(projector_at(models_dir / "mmproj.gguf", tiny_model.file_path),
                                   source="scan", n_embd=None)  # fmt: skip
    page = staff.get(reverse("admin:inference_projector_changelist")).content.decode()
    assert "mmproj.gguf" in page and "mlp" in page
    change = staff.get(reverse("admin:inference_projector_change", args=[projector.pk]))
    assert change.status_code == 200
