"""A model with a vision projector says so wherever a listing has a place for it: /api/show's
capabilities ("vision", from which Open WebUI enables image upload) and projector_info, the
families and capabilities of /api/tags, and the input modalities of /v1/models."""

import pytest
from asgiref.sync import sync_to_async
from django.test import AsyncClient

from dashboard.models import ApiKey
from inference.catalog.creating import derive
from inference.catalog.importing import register_file
from inference.catalog.projectors import register_projector, with_projector
from inference.models import LLMModel
from tests.inference.ggufs import tiny_gguf
from tests.inference.projectors import projector_at

pytestmark = pytest.mark.django_db(transaction=True)
JSON = "application/json"


@pytest.fixture
def catalog(settings, tmp_path):
    """"plain" (text only), "looker" (its file with a projector) and "peeker" (made from
    looker: its projector too)."""
    settings.MODELS_DIR = tmp_path / "models"
    settings.MODELS_DIR.mkdir()
    lm = tiny_gguf(settings.MODELS_DIR / "tiny.gguf")
    clip = projector_at(settings.MODELS_DIR / "mmproj.gguf", lm)
    plain = register_file(lm, source=LLMModel.Source.IMPORT, name="plain")
    projector = register_projector(clip, source=LLMModel.Source.IMPORT, n_embd=None)
    looker = with_projector(plain, projector, name="looker")
    derive(looker, "peeker")
    return {"plain": plain, "looker": looker}


@pytest.fixture
def headers(db):
    _, raw = ApiKey.create("reader", ApiKey.Scope.CHAT)
    return {"Authorization": f"Bearer {raw}"}


async def show(client, headers, name):
    response = await client.post("/api/show", {"model": name}, content_type=JSON,
                                 headers=headers)  # fmt: skip
    assert response.status_code == 200, response.content
    return response.json()


async def test_show_lists_vision_for_models_with_a_projector(catalog, headers):
    client = AsyncClient()
    looker = await show(client, headers, "looker")
    assert "vision" in looker["capabilities"]
    assert looker["projector_info"]["clip.projector_type"] == "mlp"
    assert looker["projector_info"]["clip.vision.image_size"] == 112
    assert looker["details"]["families"] == ["llama", "clip"]
    assert "vision" in (await show(client, headers, "peeker"))["capabilities"]
    plain = await show(client, headers, "plain")
    assert "vision" not in plain["capabilities"] and "projector_info" not in plain


async def test_tags_say_which_models_take_images(catalog, headers):
    response = await AsyncClient().get("/api/tags", headers=headers)
    tags = {tag["name"]: tag for tag in response.json()["models"]}
    assert "vision" in tags["looker:latest"]["capabilities"]
    assert "clip" in tags["looker:latest"]["details"]["families"]
    assert "vision" in tags["peeker:latest"]["capabilities"]
    assert "vision" not in tags["plain:latest"]["capabilities"]
    assert tags["plain:latest"]["details"]["families"] == ["llama"]


async def test_openai_models_give_the_input_modalities(catalog, headers):
    client = AsyncClient()
    listed = (await client.get("/v1/models", headers=headers)).json()["data"]
    inputs = {entry["id"]: entry["architecture"]["input_modalities"] for entry in listed}
    assert inputs == {"plain": ["text"], "looker": ["text", "image"], "peeker": ["text", "image"]}
    one = (await client.get("/v1/models/peeker", headers=headers)).json()
    assert one["architecture"]["input_modalities"] == ["text", "image"]


async def test_a_projector_removed_from_its_model_takes_vision_away(catalog, headers):
    looker = catalog["looker"]
    await sync_to_async(catalog["plain"].delete)()  # one text-only entry per file
    looker.projector = None
    await sync_to_async(looker.save)()
    assert "vision" not in (await show(AsyncClient(), headers, "looker"))["capabilities"]
