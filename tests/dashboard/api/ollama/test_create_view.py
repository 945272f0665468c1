"""/api/blobs and /api/create through Django's test client (no gate: the view reads the body in
chunks itself), with tiny GGUF files: a blob becomes a model, the same bytes again become a
derived model sharing them, and a chat key is refused."""

import hashlib

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from dashboard.models import ApiKey
from inference.models import LLMModel
from tests.inference.ggufs import tiny_gguf

pytestmark = pytest.mark.django_db(transaction=True)
BLOB = "application/octet-stream"
JSON = "application/json"


@pytest.fixture
def models_dir(settings, tmp_path):
    settings.MODELS_DIR = tmp_path / "models"
    settings.MODELS_DIR.mkdir()
    return settings.MODELS_DIR


async def headers_for(scope: str) -> dict:
    _, raw = await sync_to_async(ApiKey.create)(f"{scope}-app", scope)
    return {"Authorization": f"Bearer {raw}"}


async def test_a_blob_becomes_a_model_and_the_same_bytes_again_a_derived_one(models_dir, tmp_path):
    client, admin = AsyncClient(), await headers_for("admin")
    data = tiny_gguf(tmp_path / "src" / "tiny.gguf").read_bytes()
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    blob = f"/api/blobs/{digest}"
    assert (await client.head(blob, headers=admin)).status_code == 404
    assert (await client.post(blob, data, content_type=BLOB, headers=admin)).status_code == 201
    assert (await client.head(blob, headers=admin)).status_code == 200
    body = {"model": "tiny", "files": {"tiny.gguf": digest}, "system": "Be tiny.", "stream": False}
    made = await client.post("/api/create", body, content_type=JSON, headers=admin)
    assert made.status_code == 200 and made.json() == {"status": "success"}
    tiny = await LLMModel.objects.aget(name="tiny")
    assert tiny.base_id is None and tiny.system_prompt == "Be tiny." and tiny.sha256 in digest
    body = {"model": "tiny-two", "files": {"t.gguf": digest}}
    again = await client.post("/api/create", body, content_type=JSON, headers=admin)
    assert again.status_code == 200
    assert b'"status":"success"' in again.content.splitlines()[-1]
    two = await LLMModel.objects.select_related("base").aget(name="tiny-two")
    assert two.base == tiny
    assert (await client.head(blob, headers=admin)).status_code == 200  # the model has it


async def test_a_wrong_digest_is_a_400(models_dir, tmp_path):
    client, admin = AsyncClient(), await headers_for("admin")
    data = tiny_gguf(tmp_path / "src" / "tiny.gguf").read_bytes()
    wrong = "/api/blobs/sha256:" + "0" * 64
    response = await client.post(wrong, data, content_type=BLOB, headers=admin)
    assert response.status_code == 400 and "discarded" in response.json()["error"]
    assert (await client.head(wrong, headers=admin)).status_code == 404


async def test_a_chat_key_may_not_upload_or_create(models_dir):
    client, chat = AsyncClient(), await headers_for("chat")
    blob = "/api/blobs/sha256:" + "0" * 64
    assert (await client.post(blob, b"x", content_type=BLOB, headers=chat)).status_code == 403
    body = {"model": "x", "from": "y"}
    assert (await client.post("/api/create", body, content_type=JSON,
                              headers=chat)).status_code == 403  # fmt: skip


async def test_an_upload_sweeps_out_a_blob_left_unused_past_its_retention(
    models_dir, tmp_path, settings
):
    import os
    import time

    from inference.catalog import blobs

    settings.BLOB_RETENTION_HOURS = 1
    client, admin = AsyncClient(), await headers_for("admin")
    stale = await sync_to_async(blobs.blobs_dir)() / f"sha256-{'1' * 64}"
    stale.write_bytes(b"GGUF old upload")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    data = tiny_gguf(tmp_path / "src" / "tiny.gguf").read_bytes()
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    response = await client.post(f"/api/blobs/{digest}", data, content_type=BLOB, headers=admin)
    assert response.status_code == 201
    assert not stale.exists()
    assert (await client.head(f"/api/blobs/{digest}", headers=admin)).status_code == 200


async def _upload(client, headers, data: bytes) -> str:
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    sent = await client.post(f"/api/blobs/{digest}", data, content_type=BLOB, headers=headers)
    assert sent.status_code == 201
    return digest


async def test_files_with_a_clip_blob_make_a_vision_model_with_that_projector(models_dir, tmp_path):
    from inference.models import Projector
    from tests.inference.projectors import projector_at

    client, admin = AsyncClient(), await headers_for("admin")
    model_file = tiny_gguf(tmp_path / "src" / "tiny.gguf")
    clip_file = projector_at(tmp_path / "src" / "mmproj.gguf", model_file)
    model_digest = await _upload(client, admin, model_file.read_bytes())
    clip_digest = await _upload(client, admin, clip_file.read_bytes())
    # The projector named first: the header tells them apart, not the order or the name.
    body = {"model": "looker", "files": {"a.gguf": clip_digest, "tiny.gguf": model_digest}}
    made = await client.post("/api/create", body, content_type=JSON, headers=admin)
    assert made.status_code == 200, made.content
    assert b"using a.gguf as the vision projector" in made.content
    looker = await LLMModel.objects.select_related("projector").aget(name="looker")
    assert looker.projector.sha256 == clip_digest.removeprefix("sha256:")
    assert looker.projector.file_path == str(models_dir / "a.gguf")
    assert (await client.head(f"/api/blobs/{clip_digest}", headers=admin)).status_code == 200

    # The same pair again: a model derived from it (its weights and projector shared).
    body = {"model": "looker-two", "files": {"t.gguf": model_digest, "p.gguf": clip_digest},
            "system": "Look closely."}  # fmt: skip
    again = await client.post("/api/create", body, content_type=JSON, headers=admin)
    assert again.status_code == 200, again.content
    assert await Projector.objects.acount() == 1
    two = await LLMModel.objects.select_related("base__projector").aget(name="looker-two")
    assert two.base_id == looker.pk and two.system_prompt == "Look closely."
    assert await sync_to_async(lambda: two.takes_images)()

    # The registered model with another projector: an entry of its own for that pair.
    other = projector_at(tmp_path / "src" / "mmproj-2.gguf", model_file, seed=5)
    body = {"model": "looker-three",
            "files": {"t.gguf": model_digest,
                      "p.gguf": await _upload(client, admin, other.read_bytes())}}  # fmt: skip
    third = await client.post("/api/create", body, content_type=JSON, headers=admin)
    assert third.status_code == 200, third.content
    three = await LLMModel.objects.aget(name="looker-three")
    assert three.base_id is None and three.file_path == looker.file_path
    assert three.projector_id not in (None, looker.projector_id)


async def test_a_projector_blob_made_for_another_model_is_refused_and_nothing_made(
    models_dir, tmp_path
):
    from tests.inference.projectors import projector_at

    client, admin = AsyncClient(), await headers_for("admin")
    model_file = tiny_gguf(tmp_path / "src" / "tiny.gguf")
    clip_file = projector_at(tmp_path / "src" / "mmproj.gguf", model_file, n_embd=128)
    files = {"tiny.gguf": await _upload(client, admin, model_file.read_bytes()),
             "mmproj.gguf": await _upload(client, admin, clip_file.read_bytes())}  # fmt: skip
    refused = await client.post("/api/create", {"model": "looker", "files": files},
                                content_type=JSON, headers=admin)  # fmt: skip
    assert refused.status_code == 400
    assert "cannot serve this model" in refused.json()["error"]
    assert "projection width" in refused.json()["error"]
    assert not await LLMModel.all_objects.aexists()


async def test_two_language_models_in_files_are_refused(models_dir, tmp_path):
    client, admin = AsyncClient(), await headers_for("admin")
    one = tiny_gguf(tmp_path / "src" / "one.gguf")
    two = tiny_gguf(tmp_path / "src" / "two.gguf")
    files = {"one.gguf": await _upload(client, admin, one.read_bytes()),
             "two.gguf": await _upload(client, admin, two.read_bytes())}  # fmt: skip
    refused = await client.post("/api/create", {"model": "x", "files": files},
                                content_type=JSON, headers=admin)  # fmt: skip
    assert refused.status_code == 400
    assert "2 language models and 0 vision projectors" in refused.json()["error"]
