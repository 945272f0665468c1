"""The chat page's pictures over HTTP: uploaded by their owner, served back to their owner only,
and an attachment removed before it is sent."""

import re

import pytest
from django.test import Client

from dashboard.chat import images
from dashboard.models import ChatImage, Conversation, Message
from tests.inference.projector_gguf import picture

pytestmark = pytest.mark.django_db(transaction=True)

UPLOAD = "/chat/images/"


@pytest.fixture
def alice(member) -> Client:
    client = Client()
    client.force_login(member)
    return client


@pytest.fixture
def mallory(outsider) -> Client:
    client = Client()
    client.force_login(outsider)
    return client


def _upload(client: Client, data: bytes, content_type="image/png", **extra):
    return client.post(UPLOAD, data=data, content_type=content_type, **extra)


def _sent_image(user) -> ChatImage:
    image = images.store(user, picture(seed=5))
    conversation = Conversation.objects.create(user=user, title="Pictures")
    question = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                      content="What is it?")  # fmt: skip
    images.attach([image], question)
    return image


def test_an_upload_answers_the_image_id_and_its_thumbnails_url(alice, member):
    data = picture(40, 30)
    response = _upload(alice, data)
    assert response.status_code == 201
    image = response.json()["image"]
    assert image["url"] == f"/chat/images/{image['id']}/"
    assert (image["width"], image["height"]) == (40, 30)
    stored = ChatImage.objects.get(pk=image["id"])
    assert stored.user == member and stored.message is None
    assert images.path_of(stored).read_bytes() == data


def test_a_file_that_is_no_picture_gets_a_clear_400(alice):
    response = _upload(alice, b"RIFF\x00\x00\x00\x00WEBPVP8 ", content_type="image/webp")
    assert response.status_code == 400
    assert response.json()["error"]["message"] == (
        "WEBP images are not supported: send JPEG, PNG, GIF or BMP")
    assert not ChatImage.objects.exists()


def test_a_picture_over_the_cap_is_a_413(alice, monkeypatch):
    monkeypatch.setattr(images, "MAX_IMAGE_BYTES", 100)
    response = _upload(alice, picture(64, 48))
    assert response.status_code == 413
    assert "at most" in response.json()["error"]["message"]


def test_an_upload_without_a_session_is_a_json_401(client):
    response = _upload(client, picture())
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "unauthorized"


def test_an_upload_needs_the_csrf_token(member):
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(member)
    assert _upload(browser, picture()).status_code == 403
    page = browser.get("/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text).group(1)
    assert _upload(browser, picture(), headers={"X-CSRFToken": token}).status_code == 201


def test_the_owner_gets_the_picture_back(alice, member):
    image = _sent_image(member)
    response = alice.get(f"/chat/images/{image.pk}/")
    assert response.status_code == 200
    assert response["Content-Type"] == "image/png"
    assert response["X-Content-Type-Options"] == "nosniff"
    assert "private" in response["Cache-Control"]
    assert b"".join(response.streaming_content) == images.path_of(image).read_bytes()


def test_another_person_gets_a_404_for_it_as_for_one_that_does_not_exist(mallory, member):
    image = _sent_image(member)
    assert mallory.get(f"/chat/images/{image.pk}/").status_code == 404
    assert mallory.get(f"/chat/images/{image.pk + 1000}/").status_code == 404
    assert mallory.delete(f"/chat/images/{image.pk}/").status_code == 404
    assert ChatImage.objects.filter(pk=image.pk).exists()


def test_an_anonymous_visitor_gets_no_picture(client, member):
    image = _sent_image(member)
    assert client.get(f"/chat/images/{image.pk}/").status_code == 401


def test_an_attachment_is_removed_before_it_is_sent_but_a_sent_one_stays(alice, member):
    waiting = images.store(member, picture(seed=1))
    path = images.path_of(waiting)
    assert alice.delete(f"/chat/images/{waiting.pk}/").status_code == 204
    assert not ChatImage.objects.filter(pk=waiting.pk).exists()
    assert not path.exists()

    sent = _sent_image(member)
    assert alice.delete(f"/chat/images/{sent.pk}/").status_code == 409
    assert images.path_of(sent).exists()
