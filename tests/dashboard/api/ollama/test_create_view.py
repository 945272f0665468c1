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
