"""A LAN download through the real view and job: dispatched after the commit, progress polled
from the job's JSON endpoint, resumed after the server drops the connection."""

import hashlib

import pytest
from django.urls import reverse

from inference.catalog.downloads import part_path
from inference.models import Job, LLMModel
from tests.dashboard.model_pages.conftest import flashes
from tests.inference.engine.fakes import wait_until

ENDED = ("done", "failed", "cancelled")


def poll(client, job_id: int, timeout: float = 60) -> dict:
    seen: list[dict] = []

    def ended() -> bool:
        seen.append(client.get(reverse("model-job", args=[job_id])).json())
        return seen[-1]["state"] in ENDED

    assert wait_until(ended, timeout=timeout, interval=0.1), seen[-1]
    return seen[-1]


@pytest.mark.django_db(transaction=True)
def test_a_download_that_is_interrupted_resumes_and_registers_the_model(
    staff, models_dir, model_server
):
    model_server.drop_after = 12_345
    model_server.drops_left = 1
    url = model_server.url("tiny.gguf")

    response = staff.post(reverse("models-download"), {"url": url},
                          headers={"Accept": "application/json"})  # fmt: skip

    assert response.status_code == 202
    answer = poll(staff, response.json()["id"])
    served = model_server.files["tiny.gguf"]
    assert answer["state"] == "done", answer["message"]
    assert answer["sha256"] == hashlib.sha256(served).hexdigest()
    assert answer["model_url"] == reverse("model-detail", args=[answer["model"]])
    assert [r for _, r in model_server.requests] == [None, "bytes=12345-"]
    model = LLMModel.objects.get(name=answer["model"])
    assert model.source == LLMModel.Source.URL and model.sha256 == answer["sha256"]
    assert sorted(p.name for p in models_dir.iterdir()) == ["tiny.gguf"]


@pytest.mark.django_db(transaction=True)
def test_a_failed_download_leaves_no_model_and_no_partial_file(staff, models_dir, model_server):
    response = staff.post(reverse("models-download"), {"url": model_server.url("page.html")})
    assert response.status_code == 302
    job = Job.objects.get()
    answer = poll(staff, job.id)
    assert answer["state"] == "failed" and "does not serve a GGUF file" in answer["message"]
    assert list(models_dir.iterdir()) == [] and LLMModel.objects.count() == 0
    assert not part_path(job.id).exists()


@pytest.mark.django_db
def test_a_url_that_is_not_http_is_refused_without_a_job(staff, models_dir):
    response = staff.post(reverse("models-download"), {"url": "file:///etc/passwd"})
    assert response.status_code == 302
    assert flashes(response) == [
        "Download refused: only http:// and https:// URLs can be downloaded"
    ]
    assert Job.objects.count() == 0


@pytest.mark.django_db
def test_a_pending_job_can_be_cancelled_once(staff):
    job = Job.objects.create(kind=Job.Kind.DOWNLOAD, source="http://nas/m.gguf")
    url = reverse("model-job-cancel", args=[job.id])
    first = staff.post(url, headers={"Accept": "application/json"})
    assert first.status_code == 200 and first.json()["state"] == "cancelled"
    assert staff.post(url, headers={"Accept": "application/json"}).status_code == 409
