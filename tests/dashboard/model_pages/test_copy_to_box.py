"""Copy to box, the web side: only staff start a copy, only in split mode; the model's file is
served only to the bearer of a one-time token issued for its sha256 and the worker it names."""

import hashlib

import pytest
import redis as redis_lib

from inference.catalog.importing import register_file
from inference.serving import copies
from inference.serving.split_client import SplitClient

pytestmark = pytest.mark.django_db

REDIS_URL = "redis://127.0.0.1:6379/12"  # these tests' own database: only tokens go there
WORKER = "inference@gpu-box"


@pytest.fixture
def model(tiny_file):
    return register_file(tiny_file, source="scan")


@pytest.fixture
def split(settings):
    """This process as a split-mode web process (no worker needed: nothing is sent here)."""
    from inference.serving import client as client_module

    try:
        redis_lib.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis_lib.RedisError as exc:
        pytest.skip(f"Redis on 127.0.0.1:6379 does not answer: {exc}")
    shared = client_module.get_client()
    settings.SPLIT_MODE = True
    settings.REDIS_URL = REDIS_URL
    client = SplitClient(REDIS_URL)
    client_module.set_client(client)
    yield client.redis
    client_module.set_client(shared)
    client.redis.flushdb()  # this module's own database: no worker or token outlives a test


def fetch(client, model, token: str | None, worker: str = WORKER, sha256: str | None = None):
    headers = {copies.WORKER_HEADER: worker}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return client.get(f"/models/files/{sha256 or model.sha256}/", headers=headers)


def test_a_member_who_is_not_staff_cannot_copy_a_model(member_client, model):
    response = member_client.post(f"/models/{model.name}/copy/", {"worker": WORKER})
    assert response.status_code == 403


def test_an_anonymous_visitor_is_sent_to_sign_in(client, model):
    response = client.post(f"/models/{model.name}/copy/", {"worker": WORKER})
    assert response.status_code == 302 and "/login/" in response["Location"]


def test_a_copy_is_refused_in_embedded_mode(staff, model):
    response = staff.post(f"/models/{model.name}/copy/", {"worker": WORKER},
                          headers={"Accept": "application/json"})  # fmt: skip
    assert response.status_code == 409
    assert "needs split mode" in response.json()["error"]


@pytest.mark.redis
def test_a_copy_to_a_worker_that_is_not_running_is_refused(staff, model, split):
    response = staff.post(f"/models/{model.name}/copy/", {"worker": "inference@nowhere"},
                          headers={"Accept": "application/json"})  # fmt: skip
    assert response.status_code == 409
    assert response.json()["error"] == "no inference worker named inference@nowhere is running"


@pytest.mark.redis
def test_the_file_is_served_once_to_the_worker_a_token_was_issued_for(client, model, split):
    token = copies.issue_token(split, copies.CopyGrant(model.sha256, WORKER))

    response = fetch(client, model, token)
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert hashlib.sha256(body).hexdigest() == model.sha256
    assert int(response["Content-Length"]) == len(body)

    assert fetch(client, model, token).status_code == 403  # spent


@pytest.mark.redis
def test_the_file_is_refused_without_a_token(client, model, split):
    response = fetch(client, model, None)
    assert response.status_code == 403
    assert response.json() == {"error": "a copy token is required"}


@pytest.mark.redis
def test_the_file_is_refused_with_an_unknown_token(client, model, split):
    response = fetch(client, model, "not-a-token-anybody-issued")
    assert response.status_code == 403
    assert "unknown, spent or expired" in response.json()["error"]


@pytest.mark.redis
def test_the_file_is_refused_once_the_token_has_expired(client, model, split):
    token = copies.issue_token(split, copies.CopyGrant(model.sha256, WORKER))
    for key in split.scan_iter(match="appliance:copy:token:*"):
        split.expire(key, 0)  # its TTL ran out
    assert fetch(client, model, token).status_code == 403


@pytest.mark.redis
def test_a_token_serves_only_its_own_worker_and_file(client, model, split):
    token = copies.issue_token(split, copies.CopyGrant(model.sha256, WORKER))
    assert fetch(client, model, token, worker="inference@mini-pc").status_code == 403

    token = copies.issue_token(split, copies.CopyGrant(model.sha256, WORKER))
    assert fetch(client, model, token, sha256="f" * 64).status_code == 403


@pytest.mark.redis
def test_no_file_is_served_in_embedded_mode_whatever_the_token(client, model):
    assert fetch(client, model, "anything").status_code == 403


def announce(redis, worker: str, serves: tuple = ()) -> None:
    """`worker` alive with this announcement, as a real worker writes them."""
    import time

    from inference.serving import split_protocol as protocol
    from inference.serving.announcement import WorkerAnnouncement

    box = WorkerAnnouncement(
        worker=worker, instance="i1", host="gpu-box", queue=protocol.worker_queue(worker),
        serves=serves, loaded=(), queue_depth=0, running=0, ram_free_bytes=1 << 30,
        vram_free_bytes=None, time=time.time(),
    )  # fmt: skip
    redis.set(protocol.alive_key(worker), "i1", ex=30)
    redis.set(protocol.announce_key(worker), box.to_json(), ex=30)


@pytest.mark.redis
def test_a_second_copy_to_a_box_is_refused_while_the_first_is_under_way(staff, model, split):
    announce(split, WORKER)
    copies.write_status(split, model.sha256, WORKER, "copying", done=1, total=2)

    response = staff.post(f"/models/{model.name}/copy/", {"worker": WORKER},
                          headers={"Accept": "application/json"})  # fmt: skip
    assert response.status_code == 409
    assert response.json()["error"] == f"a copy of {model.name} to {WORKER} is under way"
    (box,) = staff.get(f"/models/{model.name}/boxes/").json()["boxes"]
    assert (box["copy"]["state"], box["can_copy"]) == ("copying", False)


@pytest.mark.redis
def test_a_copy_to_a_box_that_has_the_file_is_refused(staff, model, split):
    from inference.serving.announcement import ServedModel

    announce(split, WORKER, serves=(ServedModel(model.sha256, model.size_bytes),))
    response = staff.post(f"/models/{model.name}/copy/", {"worker": WORKER},
                          headers={"Accept": "application/json"})  # fmt: skip
    assert response.status_code == 409
    assert response.json()["error"] == f"{WORKER} has {model.name}'s file already"
    page = staff.get(f"/models/{model.name}/")
    assert b"has the file" in page.content and b"Copy to" not in page.content


@pytest.fixture
def looker(models_dir, tiny_file, model):
    """The tiny model's file with a vision projector: an entry of its own."""
    from inference.catalog.projectors import register_projector, with_projector
    from tests.inference.projectors import projector_at

    path = projector_at(models_dir / "mmproj.gguf", tiny_file)
    projector = register_projector(path, source="scan", n_embd=None)
    return with_projector(model, projector, name="looker")


@pytest.mark.redis
def test_a_vision_models_projector_is_copied_to_a_box_that_has_only_its_file(
    staff, looker, split
):
    from inference.serving.announcement import ServedModel

    announce(split, WORKER, serves=(ServedModel(looker.sha256, looker.size_bytes),))
    response = staff.post(f"/models/{looker.name}/copy/", {"worker": WORKER},
                          headers={"Accept": "application/json"})  # fmt: skip
    assert response.status_code == 202
    assert copies.statuses(split, looker.projector.sha256)[WORKER].state == "queued"
    assert WORKER not in copies.statuses(split, looker.sha256)  # the file is there already
    announce(split, WORKER, serves=(ServedModel(looker.sha256, looker.size_bytes),
                                    ServedModel(looker.projector.sha256, 1)))  # fmt: skip
    again = staff.post(f"/models/{looker.name}/copy/", {"worker": WORKER},
                       headers={"Accept": "application/json"})  # fmt: skip
    assert again.json()["error"] == f"{WORKER} has looker's files already"


@pytest.mark.redis
def test_the_projector_file_is_served_to_the_bearer_of_its_token(client, looker, split):
    sha256 = looker.projector.sha256
    token = copies.issue_token(split, copies.CopyGrant(sha256, WORKER))
    response = fetch(client, looker, token, sha256=sha256)
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert hashlib.sha256(body).hexdigest() == sha256
