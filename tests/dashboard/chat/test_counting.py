"""The composer's token counter through the chat WebSocket of the real ASGI app: with the model
loaded, the count is the prompt_tokens the send then reports; with it unloaded, there is no count
and the model stays unloaded."""

import pytest
from asgiref.sync import sync_to_async

from dashboard.chat.turn_request import context_of
from inference.catalog.specs import spec_for
from inference.serving.client import get_client
from tests.dashboard.web.sockets import open_socket, until_final

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

SYSTEM = "You answer in one short sentence."


@pytest.fixture
def chat_model(starter_model):
    starter_model.default_params = {"max_tokens": 8}
    starter_model.save()
    return starter_model


def loaded_names() -> set[str]:
    return {row["name"] for snap in get_client().snapshots() for row in snap.get("loaded", [])}


async def count(ws, seq: int, content: str, conversation=None, **extra) -> dict:
    await ws.send_json_to({"type": "count", "seq": seq, "conversation": conversation,
                           "content": content, **extra})  # fmt: skip
    reply = await ws.receive_json_from(timeout=60)
    assert reply["type"] == "count" and reply["seq"] == seq, reply
    return reply


@pytest.mark.model
async def test_a_loaded_model_counts_what_the_send_then_reads(chat_model, member):
    await get_client().load(await sync_to_async(spec_for)(chat_model))
    ws, _, _ = await open_socket("/ws/chat/", member)
    first = await count(ws, 1, "Name a colour.", system_prompt=SYSTEM)
    assert first["context"] == await sync_to_async(context_of)(chat_model)
    assert first["left_out"] == 0
    await ws.send_json_to({"type": "send", "conversation": None, "content": "Name a colour.",
                           "system_prompt": SYSTEM})  # fmt: skip
    opening = await ws.receive_json_from(timeout=30)
    done = (await until_final(ws))[-1]
    assert first["tokens"] == done["figures"]["prompt_tokens"]

    # The next turn's count holds the first turn too, as its send will.
    second = await count(ws, 2, "And another?", conversation=opening["id"])
    await ws.send_json_to({"type": "send", "conversation": opening["id"],
                           "content": "And another?"})  # fmt: skip
    await ws.receive_json_from(timeout=30)
    done = (await until_final(ws))[-1]
    await ws.disconnect()
    assert second["tokens"] == done["figures"]["prompt_tokens"] > first["tokens"]


@pytest.mark.model
async def test_counting_never_loads_a_model(chat_model, member):
    spec = await sync_to_async(spec_for)(chat_model)
    await get_client().unload(spec.name)
    assert spec.name not in loaded_names()
    ws, _, _ = await open_socket("/ws/chat/", member)
    reply = await count(ws, 7, "How long is this?")
    await ws.disconnect()
    assert reply["tokens"] is None  # the page shows its estimate, marked "≈"
    assert reply["context"] == await sync_to_async(context_of)(chat_model)
    assert spec.name not in loaded_names()


async def test_another_persons_conversation_is_not_counted(starter_model, member, outsider):
    from dashboard.models import Conversation

    theirs = await sync_to_async(Conversation.objects.create)(user=outsider, title="private")
    ws, _, _ = await open_socket("/ws/chat/", member)
    reply = await count(ws, 3, "Hi", conversation=theirs.pk)
    await ws.disconnect()
    assert reply == {"type": "count", "seq": 3, "tokens": None, "context": None, "left_out": 0}


@pytest.mark.parametrize(
    "frame",
    [{"seq": "1", "content": "x"}, {"seq": 1, "content": 5}, {"seq": 1},
     {"seq": 1, "content": "x" * 100_001}, {"seq": 1, "content": "x", "model": 3}],
)  # fmt: skip
async def test_a_malformed_count_frame_is_refused_with_an_error(member, frame):
    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_json_to({"type": "count", **frame})
    reply = await ws.receive_json_from(timeout=10)
    await ws.disconnect()
    assert reply["type"] == "error" and reply["code"] in ("invalid", "too_long")
