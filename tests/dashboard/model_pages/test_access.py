"""Every registry URL: anonymous users go to the login page; members may look but every change
is 403 and changes nothing; CSRF is checked on changes."""

import pytest
from django.test import Client
from django.urls import reverse

from inference.models import Job, LLMModel

pytestmark = pytest.mark.django_db


@pytest.fixture
def job(db):
    return Job.objects.create(kind=Job.Kind.DOWNLOAD, source="http://nas/m.gguf")


def pages(model, job) -> list[str]:
    return [
        reverse("models"), reverse("models-status"), reverse("model-detail", args=[model.name]),
        reverse("model-job", args=[job.id]),
    ]  # fmt: skip


def changes(model, job) -> list[tuple[str, dict]]:
    name = [model.name]
    return [
        (reverse("models-scan"), {}),
        (reverse("models-upload"), {}),
        (reverse("models-download"), {"url": "http://nas/m.gguf"}),
        (reverse("model-job-cancel", args=[job.id]), {}),
        (reverse("model-detail", args=name), {"n_ctx": 512}),
        (reverse("model-load", args=name), {}),
        (reverse("model-unload", args=name), {}),
        (reverse("model-default", args=name), {}),
        (reverse("model-delete", args=name), {}),
    ]


def test_anonymous_users_are_sent_to_the_login_page(client, tiny_model, job):
    for url in pages(tiny_model, job) + [url for url, _ in changes(tiny_model, job)]:
        response = client.post(url) if url not in pages(tiny_model, job) else client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("login") + "?next="), url


def test_members_may_look_at_the_registry(member_client, tiny_model, job):
    for url in pages(tiny_model, job):
        assert member_client.get(url).status_code == 200, url


def test_members_get_403_for_every_change_and_nothing_changes(member_client, tiny_model, job):
    before = list(LLMModel.objects.values())
    for url, data in changes(tiny_model, job):
        assert member_client.post(url, data).status_code == 403, url
    assert member_client.get(reverse("model-delete", args=[tiny_model.name])).status_code == 403
    assert list(LLMModel.objects.values()) == before
    assert Job.objects.count() == 1 and Job.objects.get().state == Job.State.PENDING


def test_changes_need_the_csrf_token(admin_user, tiny_model, job):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(admin_user)
    for url, data in changes(tiny_model, job):
        assert browser.post(url, data).status_code == 403, url
    assert LLMModel.objects.filter(name=tiny_model.name).exists()
