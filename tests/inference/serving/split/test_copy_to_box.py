"""Copy to box with a real inference worker process: the staff's "copy to box X" sends X a
task on its own queue, X fetches the model's file from the web box (a live server on loopback,
which the download guard allows for this transfer only) and keeps it in its own MODELS_DIR; a
file whose bytes are not the model's is refused and its partial file removed; a token that is
not valid gets a 403 and the copy fails with it."""

import time
from pathlib import Path

import pytest

from inference.catalog.importing import register_file
from inference.models import LLMModel
from inference.serving import copies
from inference.serving.split_protocol import worker_queue
from tests.split.workers import WorkerProcess

pytestmark = [pytest.mark.redis, pytest.mark.django_db(transaction=True)]

COPY_WAIT_S = 120.0  # a deadline on a shared 2-core box, never a speed


def models_of(worker: WorkerProcess) -> Path:
    return worker.workdir / f"{worker.label}-data" / "models"


def files_in(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir()) if directory.is_dir() else []


def finished_copy(redis, sha256: str, worker: str, since: float) -> copies.CopyStatus:
    """The worker's copy of this file that ended after `since` (an earlier test's stays)."""
    deadline = time.monotonic() + COPY_WAIT_S
    while time.monotonic() < deadline:
        status = copies.statuses(redis, sha256).get(worker)
        if status is not None and status.finished and status.time >= since:
            return status
        time.sleep(0.2)
    raise AssertionError(f"no finished copy: {copies.statuses(redis, sha256)}")


@pytest.fixture
def web_box(settings, live_server, split_client, client, admin_user, tiny_file):
    """The web side: this process's split client, the live server the worker fetches from, a
    staff member signed in, and a registered tiny model."""
    settings.WEB_URL = live_server.url
    client.force_login(admin_user)
    return client


def test_a_worker_fetches_a_model_it_lacks_from_the_web_box(
    web_box, shared_worker, split_redis, tiny_file
):
    model = register_file(tiny_file, source="scan")
    assert not any(f.endswith(".gguf") for f in files_in(models_of(shared_worker)))

    since = time.time()
    response = web_box.post(f"/models/{model.name}/copy/", {"worker": shared_worker.name})
    assert response.status_code == 302

    status = finished_copy(split_redis, model.sha256, shared_worker.name, since)
    assert status.state == "done", status
    assert status.message == f"copied to {tiny_file.name} on {shared_worker.name}"
    assert files_in(models_of(shared_worker)) == [tiny_file.name]  # and no partial file
    assert (models_of(shared_worker) / tiny_file.name).read_bytes() == tiny_file.read_bytes()

    # The model's page shows it.
    (box,) = web_box.get(f"/models/{model.name}/boxes/").json()["boxes"]
    assert (box["worker"], box["copy"]["state"]) == (shared_worker.name, "done")


def test_a_file_whose_digest_is_not_the_models_is_refused_and_its_partial_removed(
    web_box, shared_worker, split_redis, tiny_file
):
    model = register_file(tiny_file, source="scan")
    wrong = "e" * 64  # the record says one digest; the file's bytes have another
    LLMModel.objects.filter(pk=model.pk).update(sha256=wrong)
    before = files_in(models_of(shared_worker))

    since = time.time()
    web_box.post(f"/models/{model.name}/copy/", {"worker": shared_worker.name})

    status = finished_copy(split_redis, wrong, shared_worker.name, since)
    assert status.state == "failed"
    assert status.message == (f"the bytes that arrived have sha256 {model.sha256}, not the "
                              f"model's {wrong}; the copy is refused")  # fmt: skip
    assert files_in(models_of(shared_worker)) == before  # nothing kept, no partial file


def test_a_worker_sent_with_a_token_that_is_not_valid_gets_a_403(
    web_box, live_server, shared_worker, split_redis, tiny_file
):
    from appliance.celery import app

    model = register_file(tiny_file, source="scan")
    job = copies.CopyJob(
        model=model.name, sha256=model.sha256, size_bytes=model.size_bytes,
        filename=tiny_file.name, url=f"{live_server.url}/models/files/{model.sha256}/",
        token="a-token-nobody-issued",
    )  # fmt: skip
    before = files_in(models_of(shared_worker))

    since = time.time()
    app.send_task(copies.COPY_TASK, args=[job.to_dict()], queue=worker_queue(shared_worker.name))

    status = finished_copy(split_redis, model.sha256, shared_worker.name, since)
    assert status.state == "failed"
    assert status.message == "the server answered HTTP 403"
    assert files_in(models_of(shared_worker)) == before
