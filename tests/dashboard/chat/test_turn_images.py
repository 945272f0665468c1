"""A chat turn's prompt with pictures (dashboard.chat.turn_request): content parts, text first and
then the images in the order they were attached; one media marker per image in the rendered
prompt and the images as the request's media in that order; refused for a model that takes
none. Rendered with the starter's own chat template; nothing is generated."""

import time

import pytest

from dashboard.chat import ChatRefused, images, turn_request
from dashboard.models import Conversation, Message
from inference.engine.generation import MAX_IMAGES
from inference.engine.media import MEDIA_MARKER, Image
from tests.inference.projector_gguf import picture

pytestmark = pytest.mark.django_db(transaction=True)


def _asked(user, conversation, text, *seeds, parent=None) -> Message:
    question = Message.objects.create(conversation=conversation, role=Message.Role.USER,
                                      content=text, parent=parent)  # fmt: skip
    images.attach([images.store(user, picture(seed=s)) for s in seeds], question)
    return question


def _answered(conversation, question, text="It is a picture.") -> Message:
    return Message.objects.create(conversation=conversation, role=Message.Role.ASSISTANT,
                                  content=text, parent=question)  # fmt: skip


def _digests(*seeds) -> list[str]:
    import hashlib

    return [hashlib.sha256(picture(seed=s)).hexdigest() for s in seeds]


def test_a_question_with_pictures_reads_as_content_parts_text_first(vision_model, member):
    conversation = Conversation.objects.create(user=member)
    question = _asked(member, conversation, "What differs?", 1, 2)
    message = turn_request.as_chat_message("user", question.content, question.images.all())
    assert message["content"][0] == "What differs?"
    assert [type(part) for part in message["content"]] == [str, Image, Image]
    assert [part.digest for part in message["content"][1:]] == _digests(1, 2)


def test_the_prompt_holds_one_marker_per_image_and_the_request_the_images_in_order(
    vision_model, member
):
    conversation = Conversation.objects.create(user=member)
    first = _asked(member, conversation, "Look at this.", 1)
    answer = _answered(conversation, first)
    pending = [images.store(member, picture(seed=s)) for s in (2, 3)]

    prompt = turn_request.build(vision_model, conversation, "", [first, answer],
                                [{"role": "user", "content": "And these two?",
                                  "images": pending}])  # fmt: skip
    request = turn_request.answer_request(vision_model, prompt, conversation, time.time())

    assert request.prompt.count(MEDIA_MARKER) == 3
    assert [image.digest for image in request.media] == _digests(1, 2, 3)
    # Each message's text, then its images' markers, as llama-server renders content parts: no
    # newline before or after a marker.
    assert "Look at this." + MEDIA_MARKER in request.prompt
    assert "And these two?" + MEDIA_MARKER + MEDIA_MARKER in request.prompt
    assert request.prompt.index("Look at this.") < request.prompt.index("And these two?")


def test_a_question_of_pictures_alone_has_no_text_part(vision_model, member):
    conversation = Conversation.objects.create(user=member)
    question = _asked(member, conversation, "", 4)
    message = turn_request.as_chat_message("user", "", question.images.all())
    assert [type(part) for part in message["content"]] == [Image]


def test_a_model_that_takes_no_images_is_refused_with_its_name(starter_model, member):
    conversation = Conversation.objects.create(user=member)
    pending = [images.store(member, picture(seed=1))]
    with pytest.raises(ChatRefused) as refused:
        turn_request.build(starter_model, conversation, "", [],
                           [{"role": "user", "content": "What is it?", "images": pending}])
    assert refused.value.code == "no_images"
    assert refused.value.message == (f"{starter_model.name} does not take images: choose a "
                                     "model that does, or remove the images")  # fmt: skip


def test_without_a_projector_a_model_does_not_take_images(starter_model):
    assert starter_model.takes_images is False


def test_an_earlier_picture_sent_to_a_model_that_takes_none_is_refused_too(starter_model, member):
    conversation = Conversation.objects.create(user=member)
    first = _asked(member, conversation, "Look.", 1)
    with pytest.raises(ChatRefused) as refused:
        turn_request.build(starter_model, conversation, "", [first, _answered(conversation, first)],
                           [{"role": "user", "content": "And?"}])  # fmt: skip
    assert refused.value.code == "no_images"


def test_older_turns_are_left_out_past_max_images(vision_model, member, monkeypatch):
    monkeypatch.setattr(turn_request, "MAX_IMAGES", 3)
    conversation = Conversation.objects.create(user=member)
    first = _asked(member, conversation, "One.", 1, 2)
    one = _answered(conversation, first)
    second = _asked(member, conversation, "Two.", 3, parent=one)
    two = _answered(conversation, second)
    pending = [images.store(member, picture(seed=4))]

    prompt = turn_request.build(vision_model, conversation, "", [first, one, second, two],
                                [{"role": "user", "content": "Three.", "images": pending}])
    assert [image.digest for image in prompt.media] == _digests(3, 4)
    assert prompt.left_out == 2 and prompt.context_start == second.pk
    assert "One." not in prompt.text
    assert MAX_IMAGES > 3  # the real cap is larger: the test lowered it


def test_a_text_holding_the_media_marker_beside_images_is_refused(vision_model, member):
    conversation = Conversation.objects.create(user=member)
    pending = [images.store(member, picture(seed=1))]
    with pytest.raises(ChatRefused) as refused:
        turn_request.build(vision_model, conversation, "", [],
                           [{"role": "user", "content": f"What is {MEDIA_MARKER}?",
                             "images": pending}])  # fmt: skip
    assert MEDIA_MARKER in refused.value.message
