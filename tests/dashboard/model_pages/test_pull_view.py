"""The models page's "pull by name": the same pull job as /api/pull, through the real view and
job against a registry on loopback, its progress polled like a download's; staff only."""

import hashlib

import pytest
from django.urls import reverse

from inference.catalog.lookup import resolve
from inference.models import Job
from tests.dashboard.model_pages.conftest import flashes
from tests.dashboard.model_pages.test_download_view import poll
from tests.inference.catalog.pulling import conftest as pulling

# The loopback registry and tiny GGUF of the pull job's tests.
registry = pulling.registry
gguf = pulling.gguf


@pytest.mark.django_db(transaction=True)
def test_a_name_pulled_from_the_page_is_registered_under_it(staff, models_dir, registry, gguf):
    registry.publish("home", "tiny", "v1", gguf)

    response = staff.post(reverse("models-pull"), {"name": "home/tiny:v1"},
                          headers={"Accept": "application/json"})  # fmt: skip

    assert response.status_code == 202
    answer = poll(staff, response.json()["id"])
    assert answer["state"] == "done", answer["message"]
    assert answer["kind"] == "pull" and answer["source"] == "home/tiny:v1"
    assert answer["sha256"] == hashlib.sha256(gguf).hexdigest()
    assert resolve("home/tiny:v1").name == answer["model"] == "tiny-v1"
    assert staff.get(reverse("models")).content.count(b'action="/models/pull/"') == 1


@pytest.mark.django_db
def test_a_bad_name_is_refused_without_a_job(staff):
    response = staff.post(reverse("models-pull"), {"name": "a/b/c/d"})

    assert response.status_code == 302
    assert flashes(response)[0].startswith("Pull refused: 'a/b/c/d' has too many parts")
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_a_second_pull_of_a_name_follows_the_first(staff):
    first = staff.post(reverse("models-pull"), {"name": "tiny:v1"},
                       headers={"Accept": "application/json"})  # fmt: skip
    again = staff.post(reverse("models-pull"), {"name": "TINY:v1"},
                       headers={"Accept": "application/json"})  # fmt: skip

    assert first.json()["id"] == again.json()["id"]
    assert Job.objects.filter(kind=Job.Kind.PULL).count() == 1


@pytest.mark.django_db
def test_only_staff_may_pull(member_client):
    assert member_client.post(reverse("models-pull"), {"name": "tiny"}).status_code == 403
    assert Job.objects.count() == 0
