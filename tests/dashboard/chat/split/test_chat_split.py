"""The browser chat in split mode: the real ASGI app with the Redis channel layer, the answer
from a real inference worker process."""

import asyncio

import pytest
from channels.db import database_sync_to_async

from dashboard.models import Message
from tests.dashboard.web.sockets import open_socket, streamed_text, until_final

pytestmark = [
    pytest.mark.redis,
    pytest.mark.model,
    pytest.mark.django_db(transaction=True),
]


@pytest.fixture
def short_answers(starter_model):
    starter_model.default_params = {"max_tokens": 16, "temperature": 0.0}
    starter_model.save()
    return starter_model


@pytest.fixture
def long_answers(starter_model):
    starter_model.default_params = {"max_tokens": 400, "temperature": 0.0}
    starter_model.save()
    return starter_model


def _message(pk: int) -> Message:
    return Message.objects.get(pk=pk)


async def test_a_chat_answer_streams_from_the_worker_and_is_saved(
    split_client, short_answers, member, start_worker
):
    await asyncio.to_thread(start_worker)
    ws, connected, _ = await open_socket("/ws/chat/", member)
    assert connected

    await ws.send_json_to({"type": "send", "conversation": None, "content": "Say hello."})
    opening = await ws.receive_json_from(timeout=30)
    frames = await until_final(ws)
    await ws.disconnect()

    assert opening["type"] == "conversation"
    assert [f["type"] for f in frames].count("token") >= 2
    done = frames[-1]
    assert done["type"] == "done", done
    assert done["figures"]["output_tokens"] >= 2
    answer = await database_sync_to_async(_message)(opening["message_id"])
    assert answer.state == Message.State.COMPLETE
    assert answer.content == streamed_text(frames) != ""


async def test_the_partial_answer_is_saved_when_the_worker_is_killed_mid_stream(
    split_client, long_answers, member, start_worker
):
    worker = await asyncio.to_thread(start_worker)
    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_json_to(
        {"type": "send", "conversation": None, "content": "Count from 1 to 500, one per line."}
    )
    opening = await ws.receive_json_from(timeout=30)

    async def kill_after_three(frame, frames):
        if [f["type"] for f in frames].count("token") == 3:
            await asyncio.to_thread(worker.kill)

    frames = await until_final(ws, on_token=kill_after_three)
    await ws.disconnect()

    error = frames[-1]
    assert error["type"] == "error", error
    assert "the inference worker stopped while answering" in error["message"]
    answer = await database_sync_to_async(_message)(opening["message_id"])
    assert answer.state == Message.State.FAILED
    assert answer.content == streamed_text(frames) != ""
    assert "stopped while answering" in answer.error


async def test_a_question_holding_a_nul_character_is_answered_and_saved(
    split_client, short_answers, member, start_worker
):
    # PostgreSQL, which split mode runs on, stores no NUL: it is kept as U+FFFD (storable).
    await asyncio.to_thread(start_worker)
    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_json_to({"type": "send", "conversation": None, "content": "Say\x00 hello."})
    opening = await ws.receive_json_from(timeout=30)
    frames = await until_final(ws)
    await ws.disconnect()

    assert frames[-1]["type"] == "done", frames[-1]
    question = await database_sync_to_async(_message)(opening["user_message_id"])
    assert question.content == "Say\ufffd hello."
