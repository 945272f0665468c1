"""LAN downloads against a real HTTP server on localhost: registered with the hash computed on
the way, resumed with a Range request after a dropped connection, and cleaned up on failure or
cancellation."""

import hashlib
import threading

import pytest

from inference.catalog import downloads
from inference.catalog.downloads import download_model, part_path
from inference.catalog.fetching import validate_url
from inference.jobs.progress import cancel_job
from inference.models import Job, LLMModel
from tests.inference.engine.fakes import wait_until


def new_job(url: str) -> Job:
    return Job.objects.create(kind=Job.Kind.DOWNLOAD, source=url)


def leftovers(models_dir) -> list[str]:
    return sorted(p.name for p in models_dir.iterdir())


@pytest.mark.django_db
def test_a_download_is_registered_with_the_sha256_of_what_was_served(models_dir, model_server):
    job = new_job(model_server.url("tiny.gguf"))

    model = download_model(job.id)

    served = model_server.files["tiny.gguf"]
    job.refresh_from_db()
    assert job.state == Job.State.DONE and job.model_id == model.pk and job.progress == 1.0
    assert model.source == LLMModel.Source.URL
    assert model.sha256 == hashlib.sha256(served).hexdigest()
    assert (models_dir / "tiny.gguf").read_bytes() == served
    assert leftovers(models_dir) == ["tiny.gguf"]
    assert download_model(job.id).pk == model.pk  # a finished job is left alone
    assert len(model_server.requests) == 1


@pytest.mark.django_db
def test_an_interrupted_download_resumes_with_a_range_request(models_dir, model_server):
    model_server.drop_after = 10_000
    model_server.drops_left = 2
    job = new_job(model_server.url("tiny.gguf"))

    model = download_model(job.id, backoff=0.01)

    served = model_server.files["tiny.gguf"]
    assert model is not None, Job.objects.get(pk=job.pk).message
    assert [r for _, r in model_server.requests] == [None, "bytes=10000-", "bytes=20000-"]
    assert model.sha256 == hashlib.sha256(served).hexdigest()
    assert (models_dir / "tiny.gguf").read_bytes() == served
    assert leftovers(models_dir) == ["tiny.gguf"]


@pytest.mark.django_db
def test_a_server_that_ignores_range_is_downloaded_again_from_the_start(models_dir, model_server):
    model_server.drop_after = 10_000
    model_server.drops_left = 1
    model_server.ignore_range = True
    job = new_job(model_server.url("tiny.gguf"))

    model = download_model(job.id, backoff=0.01)

    assert model.sha256 == hashlib.sha256(model_server.files["tiny.gguf"]).hexdigest()


@pytest.mark.django_db
def test_a_download_that_keeps_failing_gives_up_and_leaves_nothing(models_dir, model_server):
    model_server.drop_after = 1000
    model_server.drops_left = 10
    job = new_job(model_server.url("tiny.gguf"))

    assert download_model(job.id, attempts=3, backoff=0.01) is None

    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert "gave up after 3 attempts" in job.message
    assert leftovers(models_dir) == [] and LLMModel.objects.count() == 0


@pytest.mark.django_db
def test_a_url_that_serves_no_gguf_is_refused_at_the_first_bytes(models_dir, model_server):
    job = new_job(model_server.url("page.html"))
    assert download_model(job.id) is None
    job.refresh_from_db()
    assert job.state == Job.State.FAILED and job.message == "the URL does not serve a GGUF file"
    assert leftovers(models_dir) == []


@pytest.mark.django_db
def test_a_missing_file_fails_the_job_with_the_status(models_dir, model_server):
    job = new_job(model_server.url("nope.gguf"))
    assert download_model(job.id) is None
    job.refresh_from_db()
    assert job.message == "the server answered HTTP 404"
    assert len(model_server.requests) == 1  # a 404 is not retried
    assert leftovers(models_dir) == []


@pytest.mark.django_db
def test_a_truncated_gguf_is_not_registered(models_dir, model_server, corrupt_file):
    model_server.files["broken.gguf"] = corrupt_file.read_bytes()
    job = new_job(model_server.url("broken.gguf"))
    assert download_model(job.id) is None
    job.refresh_from_db()
    assert job.state == Job.State.FAILED
    assert leftovers(models_dir) == [] and LLMModel.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_download_stops_and_leaves_no_partial_file(models_dir, model_server):
    model_server.pause_after = 8 * 1024  # the server stalls there until the job is cancelled
    job = new_job(model_server.url("tiny.gguf"))
    result = []
    worker = threading.Thread(target=lambda: result.append(download_model(job.id)))
    worker.start()
    try:
        assert wait_until(lambda: Job.objects.get(pk=job.pk).progress > 0, timeout=20)
        assert cancel_job(job)
    finally:
        model_server.resume.set()
        worker.join(timeout=30)
    job.refresh_from_db()
    assert result == [None]
    assert job.state == Job.State.CANCELLED
    assert not part_path(job.id).exists()
    assert leftovers(models_dir) == [] and LLMModel.objects.count() == 0


def test_only_http_and_https_urls_with_a_host_are_accepted():
    assert validate_url(" http://nas.local/m.gguf ") == "http://nas.local/m.gguf"
    assert validate_url("https://10.0.0.2:8080/a/b.gguf")
    for bad, reason in [
        ("file:///etc/passwd", "only http"),
        ("ftp://nas/m.gguf", "only http"),
        ("javascript:alert(1)", "only http"),
        ("http:///m.gguf", "no host"),
        ("http://nas/" + "a" * 2000, "longer than"),
    ]:
        with pytest.raises(ValueError, match=reason):
            validate_url(bad)


def test_the_file_name_comes_from_the_url_path_made_safe():
    assert downloads.filename_for("http://nas/models/Qwen2.5-0.5B.Q4_K_M.gguf?x=1") == (
        "Qwen2.5-0.5B.Q4_K_M.gguf"
    )
    assert downloads.filename_for("http://nas/../../etc/passwd") == "passwd.gguf"
    assert downloads.filename_for("http://nas/") == "model.gguf"
    assert downloads.filename_for("http://nas/a%2F..%2F..%2Fb.gguf") == "b.gguf"
