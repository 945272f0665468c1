"""Images in every dialect, through the real ASGI app (the gate included) and the real openai,
anthropic and ollama clients: each arrives as parts of the one request, and the
GenerationRequest that reaches the serving client carries the prompt with one media marker
where each image goes and the images, in the markers' order, as its media. Bad images get a
clear 4xx, and the next good request is answered.

The engine's side of images (decoding, encoding) is the runner's and is tested there: the
serving client here records the request, then answers it on fake runners with its images left
out, so what is tested is the parsing and the rendering, not the answers."""

import base64
import dataclasses
import re
from pathlib import Path

import anthropic
import httpx
import httpx2
import ollama
import openai
import pytest
from asgiref.sync import sync_to_async
from django.core.asgi import get_asgi_application

from appliance.gate import BodyGate
from dashboard.models import ApiKey
from inference.catalog.importing import register_file
from inference.catalog.projectors import register_projector
from inference.engine.generation import MAX_IMAGES
from inference.engine.host import EngineHost
from inference.engine.media import MEDIA_MARKER, Image
from inference.models import LLMModel
from inference.serving import client as client_module
from inference.serving.client import EmbeddedClient, set_client
from inference.text.prompting import render_prompt
from tests.inference.engine.fakes import FakeRunner, engines_on
from tests.inference.ggufs import tiny_gguf
from tests.inference.projector_gguf import picture, write_projector

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

M = MEDIA_MARKER
PNG, BMP = picture(seed=1), picture(seed=2, kind="bmp")
# The web side reads a picture's kind from its magic bytes only (the runner decodes it).
GIF = base64.b64decode("R0lGODlhAQABAIAAAP///wAAACH5BAEAAAAALAAAAAABAAEAAAICRAEAOw==")
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + bytes(range(64))
WEBP = b"RIFF\x24\x00\x00\x00WEBPVP8 " + bytes(32)


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_url(data: bytes, mime: str = "image/png") -> str:
    return f"data:{mime};base64,{b64(data)}"


class RecordingClient(EmbeddedClient):
    """The embedded client on fake runners, keeping every request it was asked to stream."""

    def __init__(self):
        runner = FakeRunner(n_ctx=8192, ctx_per_seq=2048)
        super().__init__(EngineHost(engines_on(lambda config: runner)))
        self.requests = []

    def stream(self, request, spec):
        self.requests.append(request)
        text_only = dataclasses.replace(request, prompt=request.prompt.replace(M, ""), media=())
        return super().stream(text_only, spec)

    @property
    def last(self):
        return self.requests[-1]


@pytest.fixture
def recording():
    previous = client_module._client
    client = RecordingClient()
    set_client(client)
    yield client
    set_client(previous)
    client.host.shutdown()


@pytest.fixture
def vision(starter_model, monkeypatch, settings, tmp_path):
    """The starter as a vision model (with the tiny projector), and a text-only model beside
    it."""
    starter_model.default_params = {"max_tokens": 2}
    starter_model.save()
    settings.MODELS_DIR = tmp_path
    path = tiny_gguf(tmp_path / "text-only.gguf", chat_template=starter_model.chat_template)
    register_file(path, source=LLMModel.Source.SCAN, name="text-only", hash_file=False)
    mmproj = write_projector(tmp_path / "mmproj-starter.gguf", Path(starter_model.file_path))
    starter_model.projector = register_projector(mmproj, source="import", n_embd=None)
    starter_model.save()
    return starter_model


@pytest.fixture
def app():
    return BodyGate(get_asgi_application())


@pytest.fixture
async def raw_key():
    _, raw = await sync_to_async(ApiKey.create)("camera-app")
    return raw


def transport(app) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), timeout=60)


@pytest.fixture
def oai(app, raw_key):
    return openai.AsyncOpenAI(base_url="http://testserver/v1", api_key=raw_key, max_retries=0,
                              http_client=transport(app))  # fmt: skip


@pytest.fixture
def claude(app, raw_key):
    # The anthropic SDK brings its own httpx (httpx2).
    client = httpx2.AsyncClient(transport=httpx2.ASGITransport(app=app), timeout=60)
    return anthropic.AsyncAnthropic(base_url="http://testserver", api_key=raw_key, max_retries=0,
                                    http_client=client)  # fmt: skip


@pytest.fixture
def olla(app, raw_key):
    return ollama.AsyncClient(host="http://testserver", transport=httpx.ASGITransport(app=app),
                              headers={"Authorization": f"Bearer {raw_key}"})  # fmt: skip


async def prompt_of(model: LLMModel, messages: list[dict]) -> str:
    """The starter's prompt for text-only `messages` (what the template sees with images)."""
    return await sync_to_async(render_prompt)(model, messages)


def kinds(request) -> list[str]:
    return [image.kind for image in request.media]


# --- every dialect -----------------------------------------------------------------------


async def test_openai_image_url_parts_enter_where_they_are_sent(vision, recording, oai):
    one_after = [{"type": "text", "text": "What is this?"},
                 {"type": "image_url", "image_url": {"url": data_url(PNG)}}]  # fmt: skip
    await oai.chat.completions.create(model=vision.name, messages=[
        {"role": "user", "content": one_after}])  # fmt: skip
    asked = recording.last
    assert asked.prompt == await prompt_of(vision, [{"role": "user",
                                                     "content": f"What is this?{M}"}])
    assert asked.media == (Image.from_bytes(PNG),)

    two_before = [{"type": "image_url", "image_url": {"url": data_url(JPEG, "image/jpeg")}},
                  {"type": "image_url", "image_url": {"url": data_url(GIF, "image/gif"),
                                                      "detail": "low"}},
                  {"type": "text", "text": "Compare them."}]  # fmt: skip
    await oai.chat.completions.create(model=vision.name, messages=[
        {"role": "user", "content": two_before}])  # fmt: skip
    assert f"{M}{M}Compare them." in recording.last.prompt
    assert kinds(recording.last) == ["jpeg", "gif"]


async def test_apply_template_shows_where_the_images_go(vision, app, raw_key):
    body = {"model": vision.name, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": data_url(PNG)}}]}]}  # fmt: skip
    async with transport(app) as client:
        response = await client.post("http://testserver/apply-template", json=body,
                                     headers={"Authorization": f"Bearer {raw_key}"})  # fmt: skip
    assert response.status_code == 200, response.text
    assert response.json()["prompt"] == await prompt_of(
        vision, [{"role": "user", "content": f"What is this?{M}"}])


async def test_apply_template_takes_the_bodies_chat_completions_takes(vision, app, raw_key):
    # Over Django's 8 MiB, under the image routes' cap: answered by chat, so shown here too.
    big = PNG + bytes(10 << 20)
    body = {"model": vision.name, "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": data_url(big)}}]}]}  # fmt: skip
    async with transport(app) as client:
        response = await client.post("http://testserver/apply-template", json=body,
                                     headers={"Authorization": f"Bearer {raw_key}"})  # fmt: skip
    assert response.status_code == 200, response.text
    assert M in response.json()["prompt"]


async def test_the_images_of_a_conversation_are_its_media_in_marker_order(vision, recording, oai):
    def image(data):
        return {"type": "image_url", "image_url": {"url": data_url(data)}}

    await oai.chat.completions.create(model=vision.name, messages=[
        {"role": "user", "content": [image(PNG), {"type": "text", "text": "And?"}]},
        {"role": "assistant", "content": "A gradient."},
        {"role": "user", "content": [{"type": "text", "text": "This one:"}, image(BMP)]},
    ])  # fmt: skip
    asked = recording.last
    assert asked.prompt.count(M) == 2 and kinds(asked) == ["png", "bmp"]
    assert asked.prompt.index(f"{M}And?") < asked.prompt.index(f"This one:{M}")


async def test_responses_input_image_enters_as_a_part(vision, recording, oai):
    await oai.responses.create(model=vision.name, input=[{"role": "user", "content": [
        {"type": "input_text", "text": "Read the page."},
        {"type": "input_image", "image_url": data_url(PNG), "detail": "auto"}]}])  # fmt: skip
    assert f"Read the page.{M}" in recording.last.prompt
    assert kinds(recording.last) == ["png"]


async def test_anthropic_base64_image_blocks_enter_where_they_are_sent(vision, recording, claude):
    await claude.messages.create(model=vision.name, max_tokens=2, messages=[{
        "role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": b64(PNG)}},
            {"type": "text", "text": "Describe it."}]}])  # fmt: skip
    asked = recording.last
    assert asked.prompt == await prompt_of(vision, [{"role": "user",
                                                     "content": f"{M}Describe it."}])
    assert asked.media == (Image.from_bytes(PNG),)


async def test_an_anthropic_tool_result_may_hold_images_as_llama_server_takes_it(
    vision, recording, claude
):
    # A tool that answers with a picture (a camera's snapshot): the tool message holds it.
    tools = [{"name": "snapshot", "input_schema": {"type": "object"}}]
    snapshot = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": b64(PNG)}}  # fmt: skip
    await claude.messages.create(model=vision.name, max_tokens=2, tools=tools, messages=[
        {"role": "user", "content": "Who is at the door?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                           "name": "snapshot", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [{"type": "text", "text": "Porch:"},
                                                  snapshot]}]},
    ])  # fmt: skip
    asked = recording.last
    assert asked.media == (Image.from_bytes(PNG),)
    assert f"Porch:{M}" in asked.prompt
    with pytest.raises(anthropic.BadRequestError, match='"text-only" does not take images'):
        await claude.messages.create(model="text-only", max_tokens=2, tools=tools, messages=[
            {"role": "user", "content": "Who?"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1",
                                               "name": "snapshot", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                          "content": [snapshot]}]},
        ])  # fmt: skip


async def test_ollama_chat_images_go_before_the_text_as_ollama_puts_them(vision, recording, olla):
    await olla.chat(model=vision.name, messages=[
        {"role": "user", "content": "What is in the frame?", "images": [PNG, BMP]}])
    asked = recording.last
    assert asked.prompt == await prompt_of(vision, [{"role": "user",
                                                     "content": f"{M}{M}What is in the frame?"}])
    assert kinds(asked) == ["png", "bmp"]


async def test_ollama_generate_places_its_images_as_chat_does(vision, recording, olla):
    await olla.generate(model=vision.name, prompt="Describe the image.", images=[PNG])
    assert recording.last.prompt == await prompt_of(
        vision, [{"role": "user", "content": f"{M}Describe the image."}])
    assert kinds(recording.last) == ["png"]
    # Raw, Ollama's own tags say where each image goes: [img-N] for the N-th.
    await olla.generate(model=vision.name, prompt="A: [img-1] B: [img-0] Same?",
                        images=[PNG, BMP], raw=True)  # fmt: skip
    assert recording.last.prompt == f"A: {M} B: {M} Same?"
    assert kinds(recording.last) == ["bmp", "png"]
    for images, named in (([PNG], "[img-1] names no image"), ([PNG, BMP, GIF], "image 2")):
        with pytest.raises(ollama.ResponseError, match=re.escape(named)):
            await olla.generate(model=vision.name, prompt="[img-0] [img-1]", images=images,
                                raw=True)  # fmt: skip


async def test_frigates_img_placeholders_take_the_images_in_order(vision, recording, olla):
    frames = [picture(seed=seed) for seed in (5, 6, 7)]
    content = "Frame 1: [img]\nFrame 2: [img]\nDescribe the activity."
    await olla.chat(model=vision.name, messages=[{"role": "user", "content": content,
                                                  "images": frames}])  # fmt: skip
    asked = recording.last
    # Two placeholders for three frames: the third goes before the text, as Ollama puts it.
    expected = f"{M}Frame 1: {M}\nFrame 2: {M}\nDescribe the activity."
    assert asked.prompt == await prompt_of(vision, [{"role": "user", "content": expected}])
    assert asked.media == tuple(Image.from_bytes(f) for f in (frames[2], frames[0], frames[1]))


async def test_ollama_images_wrapped_in_lines_are_read_as_ollama_reads_them(vision, recording, app,
                                                                          raw_key):  # fmt: skip
    # Go's base64 decoder skips line breaks, so Ollama takes a picture wrapped at 76 columns.
    wrapped = base64.encodebytes(PNG).decode()
    async with transport(app) as client:
        response = await client.post("http://testserver/api/chat", json={
            "model": vision.name, "stream": False,
            "messages": [{"role": "user", "content": "Hi", "images": [wrapped]}]},
            headers={"Authorization": f"Bearer {raw_key}"})  # fmt: skip
    assert response.status_code == 200, response.text
    assert recording.last.media == (Image.from_bytes(PNG),)


# --- bad input ---------------------------------------------------------------------------


async def test_bytes_that_are_no_picture_are_a_400_naming_the_field(vision, recording, oai, olla):
    corrupt = [{"type": "text", "text": "Hi"},
               {"type": "image_url", "image_url": {"url": data_url(b"not a picture")}}]  # fmt: skip
    with pytest.raises(openai.BadRequestError) as refused:
        await oai.chat.completions.create(model=vision.name, messages=[
            {"role": "user", "content": corrupt}])  # fmt: skip
    error = refused.value.body
    assert error["param"] == "messages.0.content"
    assert "part 1 (image_url)" in error["message"] and "not a JPEG, PNG" in error["message"]
    with pytest.raises(ollama.ResponseError) as refused:
        await olla.chat(model=vision.name, messages=[
            {"role": "user", "content": "Hi", "images": [PNG, "bm90IGFuIGltYWdl"]}])
    assert refused.value.status_code == 400
    assert refused.value.error.startswith("messages.0.images.1:")
    assert not recording.requests
    # Nothing else broke: the next good request is answered.
    await olla.chat(model=vision.name, messages=[{"role": "user", "content": "Hi",
                                                  "images": [PNG]}])  # fmt: skip
    assert kinds(recording.last) == ["png"]


async def test_webp_is_a_clear_400_since_the_decoder_does_not_read_it(vision, oai, claude):
    webp = [{"type": "image_url", "image_url": {"url": data_url(WEBP, "image/webp")}}]
    with pytest.raises(openai.BadRequestError, match="WEBP images are not supported"):
        await oai.chat.completions.create(model=vision.name, messages=[
            {"role": "user", "content": webp}])  # fmt: skip
    with pytest.raises(anthropic.BadRequestError, match="WEBP images are not supported"):
        await claude.messages.create(model=vision.name, max_tokens=2, messages=[{
            "role": "user", "content": [{"type": "image", "source": {
                "type": "base64", "media_type": "image/webp", "data": b64(WEBP)}}]}])  # fmt: skip


async def test_an_image_url_to_fetch_is_a_400_and_nothing_is_fetched(vision, recording, oai,
                                                                     claude):  # fmt: skip
    url = "http://192.0.2.1/camera/snapshot.jpg"  # TEST-NET: nothing answers there
    with pytest.raises(openai.BadRequestError, match="not fetched"):
        await oai.chat.completions.create(model=vision.name, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}]}])  # fmt: skip
    with pytest.raises(openai.BadRequestError, match="not fetched"):
        await oai.responses.create(model=vision.name, input=[{"role": "user", "content": [
            {"type": "input_image", "image_url": url.replace("http", "https")}]}])  # fmt: skip
    with pytest.raises(anthropic.BadRequestError, match="not fetched"):
        await claude.messages.create(model=vision.name, max_tokens=2, messages=[{
            "role": "user", "content": [{"type": "image", "source": {"type": "url",
                                                                     "url": url}}]}])  # fmt: skip
    assert not recording.requests


async def test_more_images_than_a_request_may_carry_is_a_400(vision, recording, oai, olla):
    image = {"type": "image_url", "image_url": {"url": data_url(GIF, "image/gif")}}
    # Over two messages, so that the limit is the request's, not a message's.
    half = [image] * (MAX_IMAGES // 2 + 1)
    with pytest.raises(openai.BadRequestError) as refused:
        await oai.chat.completions.create(model=vision.name, messages=[
            {"role": "user", "content": half}, {"role": "user", "content": half}])
    assert f"at most {MAX_IMAGES} images" in refused.value.body["message"]
    assert refused.value.body["code"] == "too_many_images"
    with pytest.raises(ollama.ResponseError) as refused:
        await olla.chat(model=vision.name, messages=[
            {"role": "user", "content": "Hi", "images": [GIF] * (MAX_IMAGES + 1)}])
    assert refused.value.status_code == 400 and "messages.0.images" in refused.value.error
    assert not recording.requests


async def test_an_image_for_a_text_only_model_is_a_400_naming_the_model(vision, recording, oai,
                                                                        olla):  # fmt: skip
    with pytest.raises(openai.BadRequestError) as refused:
        await oai.chat.completions.create(model="text-only", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(PNG)}}]}])  # fmt: skip
    assert refused.value.body["message"].startswith('"text-only" does not take images')
    assert refused.value.body["param"] == "messages"
    with pytest.raises(ollama.ResponseError) as refused:
        await olla.generate(model="text-only", prompt="Describe it.", images=[PNG])
    assert refused.value.status_code == 400
    assert refused.value.error.startswith('"text-only" does not take images')
    assert not recording.requests
    # Text to it is answered as before.
    await olla.generate(model="text-only", prompt="Hi")
    assert recording.last.media == ()


async def test_the_media_marker_in_the_text_beside_images_is_a_400(vision, recording, olla):
    with pytest.raises(ollama.ResponseError) as refused:
        await olla.chat(model=vision.name, messages=[
            {"role": "user", "content": f"Here: {M}", "images": [PNG]}])
    assert refused.value.status_code == 400 and M in refused.value.error
    assert not recording.requests


async def test_counting_images_for_a_text_only_model_is_the_400_its_answer_gets(vision, claude):
    turn = [{"role": "user", "content": [{"type": "image", "source": {
        "type": "base64", "media_type": "image/png", "data": b64(PNG)}}]}]  # fmt: skip
    with pytest.raises(anthropic.BadRequestError) as counted:
        await claude.messages.count_tokens(model="text-only", messages=turn)
    with pytest.raises(anthropic.BadRequestError) as answered:
        await claude.messages.create(model="text-only", max_tokens=2, messages=turn)
    assert counted.value.body == answered.value.body
    assert counted.value.body["error"]["message"].startswith('"text-only" does not take images')


async def test_a_body_over_the_image_cap_is_a_413_before_it_is_read(vision, recording, app,
                                                                   raw_key, settings, olla):
    headers = {"Authorization": f"Bearer {raw_key}"}
    # Above Django's own cap (8 MiB), under the image routes': read and answered.
    big = PNG + bytes(10 << 20)  # a PNG's bytes, then padding: the runner would read the PNG
    async with transport(app) as client:
        response = await client.post("http://testserver/api/chat", headers=headers, json={
            "model": vision.name, "stream": False,
            "messages": [{"role": "user", "content": "Hi", "images": [b64(big)]}]})  # fmt: skip
        assert response.status_code == 200, response.text
        assert recording.last.media[0].data == big
        # A 30 MB camera image is 40 MB of base64: refused from its Content-Length.
        huge = {"model": vision.name, "messages": [
            {"role": "user", "content": "Hi", "images": [b64(bytes(30 << 20))]}]}
        response = await client.post("http://testserver/api/chat", headers=headers, json=huge)
        assert response.status_code == 413
        assert response.json() == {"error": "the request body is too large"}
        assert settings.MAX_IMAGE_BODY_BYTES < len(response.request.content)
    await olla.chat(model=vision.name, messages=[{"role": "user", "content": "Hi",
                                                  "images": [PNG]}])  # fmt: skip
    assert kinds(recording.last) == ["png"]
