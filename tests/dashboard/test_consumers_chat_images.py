"""Pictures through the chat WebSocket (the real ASGI app): a send, a regenerate and an edit build
the GenerationRequest that reaches the serving client with the pictures as its media, in the
order they were attached, one media marker each; what cannot be sent is refused and loses
nothing. The answer itself is the runner's (issue 29 §3); here the starter answers the text."""

import asyncio
import hashlib

import pytest
from asgiref.sync import sync_to_async

from dashboard.chat import images, running, turns
from dashboard.models import ChatImage, Conversation, Message
from inference.engine.generation import MAX_IMAGES
from inference.engine.media import MEDIA_MARKER
from inference.serving.client import get_client
from tests.dashboard.web.sockets import open_socket, until_final
from tests.inference.projector_gguf import picture

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


def db(fn, *args, **kwargs):
    return sync_to_async(fn)(*args, **kwargs)


def _digest(seed: int) -> str:
    return hashlib.sha256(picture(seed=seed)).hexdigest()


def _uploaded(user, *seeds) -> list[int]:
    return [images.store(user, picture(seed=s)).pk for s in seeds]


def _images_of(message_id: int) -> list[str]:
    return [i.sha256 for i in ChatImage.objects.filter(message_id=message_id)]


@pytest.fixture
def short(vision_model):
    vision_model.default_params = {"max_tokens": 8, "temperature": 0.0}
    vision_model.save()
    return vision_model


@pytest.fixture
def reaching_the_client(monkeypatch) -> list:
    """The requests that reach the serving client, in order (they then run as ever)."""
    client = get_client()
    seen = []
    stream = client.stream

    def recording(request, spec):
        seen.append(request)
        return stream(request, spec)

    monkeypatch.setattr(client, "stream", recording)
    return seen


@pytest.fixture(autouse=True)
async def no_answer_left_running():
    yield
    with running._turns_lock:
        left = [turn for turn in running._turns.values() if turn is not None]
    for turn in left:
        await running.cancel(turn, "the test ended")
        if turn.task is not None:
            await asyncio.wait_for(asyncio.gather(turn.task, return_exceptions=True), 120)


async def _turn(ws, frame: dict) -> dict:
    await ws.send_json_to(frame)
    opening = await ws.receive_json_from(timeout=60)
    assert opening["type"] == "conversation", opening
    await until_final(ws)
    return opening


# --- the request ---------------------------------------------------------------------------------


@pytest.mark.model
async def test_a_send_with_pictures_reaches_the_client_with_them_as_media_in_order(
    short, member, reaching_the_client
):
    ids = await db(_uploaded, member, 2, 1)
    ws, _, _ = await open_socket("/ws/chat/", member)
    opening = await _turn(ws, {"type": "send", "conversation": None, "content": "Compare them.",
                               "model": short.name, "images": ids})  # fmt: skip
    # The composer's counter: the model is loaded, but its tokenizer would count the markers,
    # not the images' tokens, so there is no count and the page estimates.
    await ws.send_json_to({"type": "count", "seq": 1, "conversation": opening["id"],
                           "content": "And now?"})  # fmt: skip
    count = await ws.receive_json_from(timeout=60)
    await ws.disconnect()
    assert count["type"] == "count" and count["seq"] == 1
    assert count["tokens"] is None and count["context"] == short.n_ctx

    (request,) = reaching_the_client
    assert [image.digest for image in request.media] == [_digest(2), _digest(1)]
    assert request.prompt.count(MEDIA_MARKER) == 2
    assert "Compare them." + MEDIA_MARKER + MEDIA_MARKER in request.prompt
    question = opening["user_message_id"]
    assert await db(_images_of, question) == [_digest(2), _digest(1)]
    branch = await db(lambda: turns.branch_data(Conversation.objects.get(pk=opening["id"])))
    shown = branch["messages"][0]["images"]
    assert [image["id"] for image in shown] == ids
    assert shown[0]["url"] == f"/chat/images/{ids[0]}/"


@pytest.mark.model
async def test_regenerate_and_edit_reuse_the_questions_pictures_unless_removed(
    short, member, reaching_the_client
):
    ids = await db(_uploaded, member, 1, 2)
    ws, _, _ = await open_socket("/ws/chat/", member)
    # Pictures alone, no text: the conversation is named for them.
    opening = await _turn(ws, {"type": "send", "conversation": None, "content": "",
                               "model": short.name, "images": ids})  # fmt: skip
    conversation, question = opening["id"], opening["user_message_id"]
    assert opening["title"] == "Image"

    await _turn(ws, {"type": "regenerate", "conversation": conversation})
    kept = await _turn(ws, {"type": "edit", "conversation": conversation, "message": question,
                            "content": "What is in them?"})  # fmt: skip
    fewer = await _turn(ws, {"type": "edit", "conversation": conversation,
                             "message": kept["user_message_id"], "content": "And this one?",
                             "images": [ids[1]]})  # fmt: skip
    await ws.disconnect()

    both, second = [_digest(1), _digest(2)], [_digest(2)]
    assert [[i.digest for i in r.media] for r in reaching_the_client] == [both, both, both, second]
    assert [r.prompt.count(MEDIA_MARKER) for r in reaching_the_client] == [2, 2, 2, 1]
    # Each version of the question has its own records of the same files; the first keeps both.
    assert await db(_images_of, question) == both
    assert await db(_images_of, kept["user_message_id"]) == both
    assert await db(_images_of, fewer["user_message_id"]) == second


# --- refusals --------------------------------------------------------------------------------


async def _refused(member, frame: dict) -> dict:
    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_json_to(frame)
    reply = await ws.receive_json_from(timeout=60)
    await ws.disconnect()
    assert reply["type"] == "error", reply
    return reply


async def test_pictures_for_a_model_that_takes_none_are_refused_and_kept_waiting(
    starter_model, member
):
    ids = await db(_uploaded, member, 1)
    reply = await _refused(member, {"type": "send", "conversation": None, "content": "What?",
                                    "images": ids})  # fmt: skip
    assert reply["code"] == "no_images"
    assert reply["message"] == (f"{starter_model.name} does not take images: choose a model "
                                "that does, or remove the images")  # fmt: skip
    assert not await db(Message.objects.exists)
    waiting = await db(ChatImage.objects.get, pk=ids[0])
    assert waiting.message_id is None  # nothing lost: it can be sent to another model


async def test_someone_elses_picture_cannot_be_sent(vision_model, member, outsider):
    theirs = await db(_uploaded, outsider, 1)
    reply = await _refused(member, {"type": "send", "conversation": None, "content": "Mine?",
                                    "images": theirs})  # fmt: skip
    assert reply["code"] == "image_gone"
    assert not await db(Message.objects.exists)
    assert (await db(ChatImage.objects.get, pk=theirs[0])).message_id is None


@pytest.mark.parametrize(
    ("images_field", "code"),
    [("3", "invalid"), ([1, "2"], "invalid"), ([True], "invalid"), ([4, 4], "invalid"),
     (list(range(1, MAX_IMAGES + 2)), "too_many")],
)  # fmt: skip
async def test_a_malformed_list_of_pictures_is_refused(vision_model, member, images_field, code):
    reply = await _refused(member, {"type": "send", "conversation": None, "content": "Hi",
                                    "images": images_field})  # fmt: skip
    assert reply["code"] == code


async def test_a_message_without_text_or_pictures_is_still_refused(vision_model, member):
    reply = await _refused(member, {"type": "send", "conversation": None, "content": " ",
                                    "images": []})  # fmt: skip
    assert reply["code"] == "invalid"
