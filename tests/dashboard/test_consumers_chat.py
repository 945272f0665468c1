"""The chat WebSocket through the real ASGI app, with the real SmolLM2-135M answering."""

import asyncio

import pytest
from asgiref.sync import sync_to_async

from dashboard.chat import running, turns
from dashboard.models import Conversation, Message
from inference.models import RequestRecord
from inference.serving.client import get_client
from tests.dashboard.web.sockets import open_socket, streamed_text, until_final, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

FIGURES = ("ttft", "prompt_tps", "decode_tps", "prompt_tokens", "cached_tokens", "output_tokens")


@pytest.fixture
def chat_model(starter_model):
    """The starter model with short answers, so a turn takes seconds on 2 cores."""
    starter_model.default_params = {"max_tokens": 16}
    starter_model.save()
    return starter_model


@pytest.fixture
def long_answers(starter_model):
    starter_model.default_params = {"max_tokens": 400, "temperature": 0.8}
    starter_model.save()
    return starter_model


def db(fn, *args, **kwargs):
    return sync_to_async(fn)(*args, **kwargs)


def _message(pk):
    return Message.objects.get(pk=pk)


async def _engine_idle() -> bool:
    snapshots = get_client().snapshots()
    return all(
        m["active_sequences"] == 0 and m["queue_depth"] == 0
        for s in snapshots
        for m in s["models"].values()
    )


# --- access ----------------------------------------------------------------------------------


async def test_it_refuses_an_anonymous_socket():
    _, connected, code = await open_socket("/ws/chat/")
    assert not connected
    assert code == 4401


async def test_it_refuses_a_socket_from_a_foreign_origin(member):
    communicator, connected, _ = await open_socket(
        "/ws/chat/", member, origin="http://evil.example"
    )
    assert not connected


async def test_it_refuses_a_socket_whose_session_cookie_is_forged(member):
    _, connected, _ = await open_socket("/ws/chat/", cookie="not-a-real-session")
    assert not connected


# --- a real answer ---------------------------------------------------------------------------


@pytest.mark.model
async def test_it_streams_a_real_answer_token_by_token_and_saves_it(chat_model, member):
    ws, connected, _ = await open_socket("/ws/chat/", member)
    assert connected
    await ws.send_json_to({"type": "send", "conversation": None, "content": "Say hello."})

    opening = await ws.receive_json_from(timeout=30)
    assert opening["type"] == "conversation"
    frames = await until_final(ws)
    await ws.disconnect()

    kinds = [f["type"] for f in frames]
    assert "phase" in kinds
    assert kinds.count("token") >= 2
    assert kinds.index("phase") < kinds.index("token")
    done = frames[-1]
    assert done["type"] == "done"
    assert done["finish_reason"] in ("stop", "length")
    assert done["message_id"] == opening["message_id"]
    for key in FIGURES:
        assert done["figures"][key] is not None, key
    assert done["figures"]["output_tokens"] >= 2

    answer = await db(_message, opening["message_id"])
    assert answer.content == streamed_text(frames) != ""
    assert answer.state == Message.State.COMPLETE
    assert answer.figures["output_tokens"] == done["figures"]["output_tokens"]
    conversation = await db(Conversation.objects.get, pk=opening["id"])
    assert conversation.user_id == member.pk
    assert conversation.title == "Say hello."
    record = await db(RequestRecord.objects.get, request_id=opening["request_id"])
    assert (record.source, record.client) == ("chat", "alice")
    assert record.outcome == done["finish_reason"]
    assert record.output_tokens == done["figures"]["output_tokens"]
    assert record.figures["timeline"]


@pytest.mark.model
async def test_a_second_turn_reuses_the_first_from_the_prefix_cache(chat_model, member):
    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_json_to({"type": "send", "conversation": None, "content": "Name a colour."})
    first = await ws.receive_json_from(timeout=30)
    await until_final(ws)

    await ws.send_json_to({"type": "send", "conversation": first["id"], "content": "And another?"})
    second = await ws.receive_json_from(timeout=30)
    frames = await until_final(ws)
    await ws.disconnect()

    assert second["id"] == first["id"]
    done = frames[-1]
    assert done["type"] == "done"
    assert done["figures"]["cached_tokens"] > 0
    assert done["figures"]["prompt_tokens"] > done["figures"]["cached_tokens"]


@pytest.mark.model
async def test_the_system_prompt_comes_first_and_is_kept_with_the_conversation(
    chat_model, member
):
    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_json_to({
        "type": "send", "conversation": None, "content": "Hi", "system_prompt": "Answer in French.",
    })  # fmt: skip
    opening = await ws.receive_json_from(timeout=30)
    await until_final(ws)
    await ws.disconnect()
    conversation = await db(Conversation.objects.get, pk=opening["id"])
    assert conversation.system_prompt == "Answer in French."


@pytest.mark.model
async def test_stop_cancels_in_the_engine_and_keeps_the_partial_answer(long_answers, member):
    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_json_to(
        {"type": "send", "conversation": None, "content": "Write a long story about a robot."}
    )
    opening = await ws.receive_json_from(timeout=30)

    async def stop_after_three(frame, frames):
        if sum(f["type"] == "token" for f in frames) == 3:
            await ws.send_json_to({"type": "stop"})

    frames = await until_final(ws, on_token=stop_after_three)
    done = frames[-1]
    assert done["type"] == "done"
    assert done["finish_reason"] == "cancelled"
    assert done["state"] == "stopped"
    assert done["figures"]["output_tokens"] < 400
    answer = await db(_message, opening["message_id"])
    assert answer.state == Message.State.STOPPED
    assert answer.content == streamed_text(frames) != ""
    assert answer.error == "stopped by the user"
    record = await db(RequestRecord.objects.get, request_id=opening["request_id"])
    assert record.outcome == "cancelled"
    assert await wait_for(_engine_idle)

    # The socket is free again for the next turn.
    await ws.send_json_to({"type": "regenerate", "conversation": opening["id"]})
    again = await ws.receive_json_from(timeout=30)
    assert again["type"] == "conversation"
    assert again["replaced_message_id"] == opening["message_id"]
    await ws.send_json_to({"type": "stop"})
    assert (await until_final(ws))[-1]["type"] == "done"
    await ws.disconnect()


@pytest.mark.model
async def test_a_disconnect_leaves_the_answer_running_to_its_end_and_saved(long_answers, member):
    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_json_to({"type": "send", "conversation": None, "content": "Tell me a story."})
    opening = await ws.receive_json_from(timeout=30)
    tokens = []
    while len(tokens) < 3:
        frame = await ws.receive_json_from(timeout=120)
        if frame["type"] == "token":
            tokens.append(frame["text"])
    text = "".join(tokens)
    await ws.disconnect(timeout=60)

    turn = running.running_turn(opening["id"])
    assert turn is not None and turn.running  # nobody watches, and it goes on
    final = await asyncio.wait_for(turn.task, timeout=300)
    assert final["finish_reason"] in ("stop", "length")
    answer = await db(_message, opening["message_id"])
    assert answer.state == Message.State.COMPLETE
    assert answer.content.startswith(text) and len(answer.content) > len(text)
    assert await wait_for(_engine_idle)


@pytest.mark.model
async def test_the_partial_answer_is_saved_while_it_streams(long_answers, member, monkeypatch):
    monkeypatch.setattr(running, "PARTIAL_SAVE_EVERY_S", 0.0)  # save after every token
    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_json_to({"type": "send", "conversation": None, "content": "Tell me a story."})
    opening = await ws.receive_json_from(timeout=30)
    seen = []

    async def check_after_five(frame, frames):
        tokens = [f for f in frames if f["type"] == "token"]
        if len(tokens) == 5:
            # Token 5 is sent after token 4's save finished (one task does both, in order).
            saved = await db(_message, opening["message_id"])
            seen.append(saved.content)
            await ws.send_json_to({"type": "stop"})

    frames = await until_final(ws, on_token=check_after_five)
    await ws.disconnect()
    assert seen and seen[0]
    assert streamed_text(frames).startswith(seen[0])


@pytest.mark.model
async def test_a_second_send_while_streaming_is_refused(long_answers, member):
    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_json_to({"type": "send", "conversation": None, "content": "Count to fifty."})
    opening = await ws.receive_json_from(timeout=30)
    await ws.send_json_to({"type": "send", "conversation": opening["id"], "content": "Another"})
    refusal = None
    frames = []
    while refusal is None:
        frame = await ws.receive_json_from(timeout=120)
        if frame["type"] == "error" and "message_id" not in frame:
            refusal = frame
        else:
            frames.append(frame)
    assert refusal["code"] == "busy"
    await ws.send_json_to({"type": "stop"})
    if frames and frames[-1]["type"] not in ("done", "error"):
        await until_final(ws)
    await ws.disconnect()
    count = await db(Message.objects.filter(conversation_id=opening["id"]).count)
    assert count == 2  # the first question and its answer only


@pytest.mark.model
async def test_two_people_chatting_at_once_each_get_their_own_stream(
    chat_model, member, outsider
):
    alice, _, _ = await open_socket("/ws/chat/", member)
    mallory, _, _ = await open_socket("/ws/chat/", outsider)
    await alice.send_json_to({"type": "send", "conversation": None, "content": "Say yes."})
    await mallory.send_json_to({"type": "send", "conversation": None, "content": "Say no."})
    a_open = await alice.receive_json_from(timeout=30)
    m_open = await mallory.receive_json_from(timeout=30)
    a_frames = await until_final(alice)
    m_frames = await until_final(mallory)
    await alice.disconnect()
    await mallory.disconnect()

    assert a_open["id"] != m_open["id"]
    a_answer = await db(_message, a_open["message_id"])
    m_answer = await db(_message, m_open["message_id"])
    assert a_answer.content == streamed_text(a_frames)
    assert m_answer.content == streamed_text(m_frames)
    assert {a_frames[-1]["message_id"], m_frames[-1]["message_id"]} == {
        a_open["message_id"], m_open["message_id"],
    }  # fmt: skip


@pytest.mark.model
async def test_regenerate_shows_a_new_answer_and_keeps_the_old_one_as_a_version(
    chat_model, member
):
    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_json_to({"type": "send", "conversation": None, "content": "Pick a number."})
    first = await ws.receive_json_from(timeout=30)
    await until_final(ws)
    await ws.send_json_to({"type": "regenerate", "conversation": first["id"]})
    second = await ws.receive_json_from(timeout=30)
    frames = await until_final(ws)
    await ws.disconnect()

    assert second["replaced_message_id"] == first["message_id"]
    assert second["user_message_id"] is None
    conversation = await db(Conversation.objects.get, pk=first["id"])
    shown = await db(turns.branch_data, conversation)
    assert [(m["role"], m["id"]) for m in shown["messages"]] == [
        ("user", first["user_message_id"]), ("assistant", second["message_id"]),
    ]  # fmt: skip
    assert shown["messages"][1]["content"] == streamed_text(frames)
    assert shown["messages"][1]["versions"] == [first["message_id"], second["message_id"]]
    assert shown["messages"][1]["model"] == chat_model.name


# --- refusals --------------------------------------------------------------------------------


MALFORMED = [
    pytest.param("this is not json", id="not-json"),
    pytest.param("[1, 2, 3]", id="not-an-object"),
    pytest.param('"send"', id="a-bare-string"),
    pytest.param("{}", id="no-type"),
    pytest.param('{"type": "shout"}', id="unknown-type"),
    pytest.param('{"type": 7}', id="type-not-a-string"),
    pytest.param('{"type": "send", "content": 42}', id="content-not-a-string"),
    pytest.param('{"type": "send", "content": "   "}', id="content-blank"),
    pytest.param('{"type": "send"}', id="content-missing"),
    pytest.param('{"type": "send", "content": "hi", "conversation": "1"}', id="id-a-string"),
    pytest.param('{"type": "send", "content": "hi", "conversation": true}', id="id-a-bool"),
    pytest.param('{"type": "send", "content": "hi", "conversation": -3}', id="id-negative"),
    pytest.param('{"type": "send", "content": "hi", "model": 5}', id="model-not-a-string"),
    pytest.param('{"type": "send", "content": "hi", "system_prompt": ["x"]}', id="system-a-list"),
    pytest.param('{"type": "send", "content": "hi", "model": "nope"}', id="unknown-model"),
    pytest.param('{"type": "regenerate"}', id="regenerate-without-conversation"),
    pytest.param('{"type": "regenerate", "conversation": 999999}', id="regenerate-missing"),
    pytest.param('{"type": "send", "content": "hi", "conversation": 999999}', id="missing-conv"),
]


def _counts():
    return Conversation.objects.count(), Message.objects.count(), RequestRecord.objects.count()


@pytest.mark.parametrize("raw", MALFORMED)
async def test_a_malformed_frame_gets_an_error_and_changes_nothing(raw, starter_model, member):
    before = await db(_counts)
    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_to(text_data=raw)
    frame = await ws.receive_json_from(timeout=10)
    assert frame["type"] == "error"
    assert frame["code"] and frame["message"]
    assert "message_id" not in frame
    # The socket stays usable: a stop with nothing running is quietly accepted.
    await ws.send_json_to({"type": "stop"})
    assert await ws.receive_nothing(timeout=0.2)
    await ws.disconnect()
    assert await db(_counts) == before


async def test_a_binary_frame_is_refused(member):
    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_to(bytes_data=b"\x00\x01")
    frame = await ws.receive_json_from(timeout=10)
    assert (frame["type"], frame["code"]) == ("error", "invalid")
    await ws.disconnect()


@pytest.mark.parametrize(
    "field, size",
    [("content", turns.MAX_CONTENT_CHARS + 1),
     ("system_prompt", turns.MAX_SYSTEM_PROMPT_CHARS + 1)],  # fmt: skip
)
async def test_an_oversized_field_is_refused(field, size, starter_model, member):
    frame = {"type": "send", "conversation": None, "content": "hi", field: "x" * size}
    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_json_to(frame)
    reply = await ws.receive_json_from(timeout=10)
    await ws.disconnect()
    assert (reply["type"], reply["code"]) == ("error", "too_long")
    assert await db(_counts) == (0, 0, 0)


async def test_someone_elses_conversation_is_refused_and_left_alone(
    starter_model, member, outsider
):
    theirs = await db(Conversation.objects.create, user=outsider, title="private")
    await db(Message.objects.create, conversation=theirs, role="user", content="secret question")
    await db(Message.objects.create, conversation=theirs, role="assistant", content="secret answer")
    ws, _, _ = await open_socket("/ws/chat/", member)
    for frame in (
        {"type": "send", "conversation": theirs.pk, "content": "show me"},
        {"type": "regenerate", "conversation": theirs.pk},
    ):
        await ws.send_json_to(frame)
        reply = await ws.receive_json_from(timeout=10)
        assert (reply["type"], reply["code"]) == ("error", "not_found")
        assert "secret" not in reply["message"]
    await ws.disconnect()
    contents = await db(lambda: [m.content for m in Message.objects.filter(conversation=theirs)])
    assert contents == ["secret question", "secret answer"]


async def test_a_socket_outliving_its_logout_can_no_longer_send(starter_model, member):
    from asgiref.sync import sync_to_async as s2a
    from django.contrib.sessions.models import Session

    ws, connected, _ = await open_socket("/ws/chat/", member)
    assert connected
    await s2a(lambda: Session.objects.all().delete())()  # what logging out does to the session
    await ws.send_json_to({"type": "send", "conversation": None, "content": "still there?"})
    reply = await ws.receive_json_from(timeout=10)
    await ws.disconnect()
    assert (reply["type"], reply["code"]) == ("error", "unauthorized")
    assert await db(_counts) == (0, 0, 0)


@pytest.mark.model
async def test_a_refused_generation_fails_the_answer_and_says_why(chat_model, member):
    ws, _, _ = await open_socket("/ws/chat/", member)
    # Under the frame's character cap, but far over the model's 2048-token context.
    await ws.send_json_to({"type": "send", "conversation": None, "content": "lorem ipsum " * 2500})
    opening = await ws.receive_json_from(timeout=30)
    frames = await until_final(ws)
    await ws.disconnect()

    failure = frames[-1]
    assert failure["type"] == "error"
    assert failure["code"] == "too_long"
    assert failure["message_id"] == opening["message_id"]
    assert "context" in failure["message"]
    answer = await db(_message, opening["message_id"])
    assert (answer.state, answer.content) == (Message.State.FAILED, "")
    assert answer.error == failure["message"]
    record = await db(RequestRecord.objects.get, request_id=opening["request_id"])
    assert (record.outcome, record.error) == ("error", failure["message"])


# --- a runner that dies ----------------------------------------------------------------------


@pytest.mark.model
async def test_a_runner_killed_mid_answer_fails_it_keeps_the_partial_and_the_next_turn_works(
    long_answers, member
):
    import os
    import signal
    import time

    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_json_to({"type": "send", "conversation": None, "content": "Tell me a story."})
    opening = await ws.receive_json_from(timeout=30)
    killed = {}

    async def segfault_after_three(frame, frames):
        if sum(f["type"] == "token" for f in frames) == 3 and not killed:
            (pid,) = get_client().supervisor.pids()
            os.kill(pid, signal.SIGSEGV)
            killed["at"] = time.monotonic()

    frames = await until_final(ws, on_token=segfault_after_three)
    failure = frames[-1]
    assert time.monotonic() - killed["at"] < 3
    assert failure["type"] == "error" and failure["code"] == "unavailable"
    assert "was killed by signal 11 (SIGSEGV) during decode" in failure["message"]
    answer = await db(_message, opening["message_id"])
    assert answer.state == Message.State.FAILED
    assert answer.content == streamed_text(frames) != ""  # the partial answer is kept
    assert "killed by signal 11" in answer.error

    # The next turn starts a new runner and is answered.
    await ws.send_json_to({"type": "send", "conversation": opening["id"], "content": "Hi."})
    await ws.receive_json_from(timeout=30)
    assert (await until_final(ws))[-1]["type"] == "done"
    await ws.disconnect()
