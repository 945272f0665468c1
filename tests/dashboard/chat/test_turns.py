"""Chat turns beyond a plain send, through the real ASGI app with SmolLM2-135M answering:
reattaching after a reload, Continue, versions (regenerate, edit, switch), rename, long chats
that outgrow the context, and the caps that keep detached answers bounded."""

import asyncio

import pytest
from asgiref.sync import sync_to_async

from dashboard.chat import running, turns
from dashboard.models import Conversation, Message
from inference.serving.client import get_client
from tests.dashboard.web.sockets import open_socket, streamed_text, until_final, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio, pytest.mark.model]


def db(fn, *args, **kwargs):
    return sync_to_async(fn)(*args, **kwargs)


def _message(pk):
    return Message.objects.get(pk=pk)


def _branch(conversation_id):
    return turns.branch_data(Conversation.objects.get(pk=conversation_id))


@pytest.fixture(autouse=True)
async def no_answer_left_running():
    """An answer outlives its socket by design: stop what a test left, and wait for its save."""
    yield
    with running._turns_lock:
        left = [turn for turn in running._turns.values() if turn is not None]
    for turn in left:
        await running.cancel(turn, "the test ended")
        if turn.task is not None:
            await asyncio.wait_for(asyncio.gather(turn.task, return_exceptions=True), 120)


@pytest.fixture
def short_answers(starter_model):
    starter_model.default_params = {"max_tokens": 12, "temperature": 0.0}
    starter_model.save()
    return starter_model


@pytest.fixture
def long_answers(starter_model):
    starter_model.default_params = {"max_tokens": 300, "temperature": 0.8}
    starter_model.save()
    return starter_model


async def _tokens(ws, count: int) -> list[dict]:
    frames = []
    while sum(f["type"] == "token" for f in frames) < count:
        frames.append(await ws.receive_json_from(timeout=120))
    return frames


async def _turn(ws, frame: dict) -> tuple[dict, list[dict]]:
    await ws.send_json_to(frame)
    opening = await ws.receive_json_from(timeout=60)
    assert opening["type"] == "conversation", opening
    return opening, await until_final(ws)


# --- a reload mid-answer -------------------------------------------------------------------------


async def test_a_new_socket_reattaches_to_a_running_answer_and_gets_all_of_it(long_answers, member):
    first, _, _ = await open_socket("/ws/chat/", member)
    await first.send_json_to({"type": "send", "conversation": None, "content": "Tell a story."})
    opening = await first.receive_json_from(timeout=60)
    before = streamed_text(await _tokens(first, 3))
    await first.disconnect(timeout=60)  # the reload

    second, _, _ = await open_socket("/ws/chat/", member)
    await second.send_json_to({"type": "attach", "conversation": opening["id"]})
    again = await second.receive_json_from(timeout=30)
    assert again["type"] == "conversation" and again["attached"] is True
    assert again["message_id"] == opening["message_id"]
    snapshot = await second.receive_json_from(timeout=30)
    assert snapshot["type"] == "snapshot"
    assert snapshot["text"].startswith(before)
    frames = await until_final(second)
    await second.disconnect()

    final = frames[-1]
    assert final["type"] == "done" and final["finish_reason"] in ("stop", "length")
    whole = snapshot["text"] + streamed_text(frames)
    assert final["text"] == whole
    answer = await db(_message, opening["message_id"])
    assert (answer.state, answer.content) == (Message.State.COMPLETE, whole)


async def test_stop_from_the_reattached_socket_cancels_the_answer(long_answers, member):
    first, _, _ = await open_socket("/ws/chat/", member)
    await first.send_json_to({"type": "send", "conversation": None, "content": "Tell a story."})
    opening = await first.receive_json_from(timeout=60)
    await _tokens(first, 2)
    await first.disconnect(timeout=60)

    second, _, _ = await open_socket("/ws/chat/", member)
    await second.send_json_to({"type": "attach", "conversation": opening["id"]})
    await second.receive_json_from(timeout=30)  # conversation
    await second.receive_json_from(timeout=30)  # snapshot
    await second.send_json_to({"type": "stop"})
    final = (await until_final(second))[-1]
    await second.disconnect()
    assert (final["type"], final["finish_reason"]) == ("done", "cancelled")
    answer = await db(_message, opening["message_id"])
    assert answer.state == Message.State.STOPPED and answer.content == final["text"] != ""


@pytest.fixture
def endless_answers(starter_model):
    starter_model.default_params = {"max_tokens": 1500, "temperature": 0.0}
    starter_model.save()
    return starter_model


async def _runs_as(request_id: str, priority: str) -> bool:
    """Whether the request's row in its engine's snapshot has this priority."""
    snapshots = await asyncio.to_thread(get_client().snapshots)
    rows = [row for snapshot in snapshots for model in snapshot["models"].values()
            for row in model.get("streams") or []]  # fmt: skip
    return any(row["id"] == request_id[:8] and row["priority"] == priority for row in rows)


async def test_an_answer_nobody_watches_runs_as_background_until_a_reader_attaches(
    endless_answers, member
):
    first, _, _ = await open_socket("/ws/chat/", member)
    await first.send_json_to({"type": "send", "conversation": None,
                              "content": "Count from 1 to 1000, separated by commas."})  # fmt: skip
    opening = await first.receive_json_from(timeout=60)
    await _tokens(first, 2)
    rid = opening["request_id"]
    turn = running.running_turn(opening["id"])
    assert turn.request.share == f"user:{member.pk}"  # the person's turn in fair share
    assert await wait_for(lambda: _runs_as(rid, "interactive"))

    await first.disconnect(timeout=60)  # the tab is closed; the answer runs on
    assert await wait_for(lambda: _runs_as(rid, "background"))

    second, _, _ = await open_socket("/ws/chat/", member)
    await second.send_json_to({"type": "attach", "conversation": opening["id"]})
    assert (await second.receive_json_from(timeout=30))["attached"] is True
    await second.receive_json_from(timeout=30)  # the snapshot
    assert await wait_for(lambda: _runs_as(rid, "interactive"))  # someone reads it again

    await second.send_json_to({"type": "stop"})
    assert (await until_final(second))[-1]["finish_reason"] == "cancelled"
    await second.disconnect()


async def test_attaching_when_nothing_runs_says_so(short_answers, member):
    ws, _, _ = await open_socket("/ws/chat/", member)
    opening, _ = await _turn(ws, {"type": "send", "conversation": None, "content": "Hi."})
    await ws.send_json_to({"type": "attach", "conversation": opening["id"]})
    reply = await ws.receive_json_from(timeout=30)
    await ws.disconnect()
    assert (reply["type"], reply["id"], reply["running"]) == ("attached", opening["id"], False)
    assert [m["id"] for m in reply["messages"]] == [
        opening["user_message_id"],
        opening["message_id"],
    ]
    assert reply["messages"][1]["state"] == "complete"


async def test_nobody_else_can_attach_to_an_answer(long_answers, member, outsider):
    alice, _, _ = await open_socket("/ws/chat/", member)
    await alice.send_json_to({"type": "send", "conversation": None, "content": "My secret."})
    opening = await alice.receive_json_from(timeout=60)
    mallory, _, _ = await open_socket("/ws/chat/", outsider)
    for frame in (
        {"type": "attach", "conversation": opening["id"]},
        {"type": "continue", "conversation": opening["id"]},
        {"type": "switch", "conversation": opening["id"], "message": opening["message_id"]},
        {"type": "rename", "conversation": opening["id"], "title": "mine now"},
        {"type": "edit", "conversation": opening["id"], "message": opening["user_message_id"],
         "content": "x"},
    ):  # fmt: skip
        await mallory.send_json_to(frame)
        reply = await mallory.receive_json_from(timeout=30)
        assert (reply["type"], reply["code"]) == ("error", "not_found"), frame
    assert await mallory.receive_nothing(timeout=0.5)  # and no token of Alice's ever arrives
    await mallory.disconnect()
    await alice.send_json_to({"type": "stop"})
    await until_final(alice)
    await alice.disconnect()


async def test_answers_left_running_count_against_the_users_cap(long_answers, member, settings):
    settings.MAX_SOCKETS_PER_USER = 1
    first, _, _ = await open_socket("/ws/chat/", member)
    await first.send_json_to({"type": "send", "conversation": None, "content": "Tell a story."})
    opening = await first.receive_json_from(timeout=60)
    await first.disconnect(timeout=60)

    second, _, _ = await open_socket("/ws/chat/", member)
    await second.send_json_to({"type": "send", "conversation": None, "content": "Another?"})
    reply = await second.receive_json_from(timeout=30)
    assert (reply["type"], reply["code"]) == ("error", "too_many")
    await second.send_json_to({"type": "attach", "conversation": opening["id"]})
    assert (await second.receive_json_from(timeout=30))["attached"] is True
    await second.send_json_to({"type": "stop"})
    await until_final(second)
    await second.disconnect()
    assert await db(Conversation.objects.count) == 1


# --- Continue ------------------------------------------------------------------------------------


async def test_continue_writes_on_into_the_same_answer(short_answers, member):
    ws, _, _ = await open_socket("/ws/chat/", member)
    opening, frames = await _turn(
        ws, {"type": "send", "conversation": None, "content": "Count from one to fifty."}
    )
    assert frames[-1]["finish_reason"] == "length"
    before = frames[-1]["text"]

    again, more = await _turn(ws, {"type": "continue", "conversation": opening["id"]})
    await ws.disconnect()
    assert again["kind"] == "continue"
    assert again["message_id"] == opening["message_id"]
    final = more[-1]
    assert final["type"] == "done"
    assert final["text"] == before + streamed_text(more)
    assert len(final["text"]) > len(before)
    assert final["figures"]["answer_tokens"] == 12 + final["figures"]["output_tokens"]
    # The continuation is computed over the conversation and the partial answer, mostly cached.
    assert final["figures"]["cached_tokens"] > 0
    answer = await db(_message, opening["message_id"])
    assert answer.content == final["text"]
    assert await db(Message.objects.filter(conversation_id=opening["id"]).count) == 2


async def test_continue_without_an_answer_is_refused(short_answers, member):
    conversation = await db(Conversation.objects.create, user=member, title="t")
    await db(Message.objects.create, conversation=conversation, role="user", content="hi")
    ws, _, _ = await open_socket("/ws/chat/", member)
    await ws.send_json_to({"type": "continue", "conversation": conversation.pk})
    reply = await ws.receive_json_from(timeout=30)
    await ws.disconnect()
    assert (reply["type"], reply["code"]) == ("error", "nothing_to_continue")


# --- versions ------------------------------------------------------------------------------------


async def test_edit_and_regenerate_keep_versions_to_flip_through(short_answers, member):
    ws, _, _ = await open_socket("/ws/chat/", member)
    one, _ = await _turn(ws, {"type": "send", "conversation": None, "content": "Name a fruit."})
    cid = one["id"]
    two, _ = await _turn(ws, {"type": "send", "conversation": cid, "content": "And a colour?"})
    regen, _ = await _turn(ws, {"type": "regenerate", "conversation": cid})
    assert regen["replaced_message_id"] == two["message_id"]

    # Editing the first question replaces everything after it, and keeps the old branch.
    edit_frame = {"type": "edit", "conversation": cid, "message": one["user_message_id"]}
    edit, _ = await _turn(ws, {**edit_frame, "content": "Name a tree."})
    assert edit["truncate_from"] == one["user_message_id"]
    shown = await db(_branch, cid)
    assert [m["id"] for m in shown["messages"]] == [edit["user_message_id"], edit["message_id"]]
    assert shown["messages"][0]["content"] == "Name a tree."
    assert shown["messages"][0]["versions"] == [one["user_message_id"], edit["user_message_id"]]

    # Flipping back to the first question shows its newest branch: the regenerated answer.
    await ws.send_json_to(
        {"type": "switch", "conversation": cid, "message": one["user_message_id"]}
    )
    branch = await ws.receive_json_from(timeout=30)
    assert branch["type"] == "branch"
    assert [m["id"] for m in branch["messages"]] == [
        one["user_message_id"], one["message_id"], two["user_message_id"], regen["message_id"],
    ]  # fmt: skip
    assert branch["messages"][3]["versions"] == [two["message_id"], regen["message_id"]]
    # ...and the next question follows that branch.
    after, _ = await _turn(ws, {"type": "send", "conversation": cid, "content": "Thanks."})
    shown = await db(_branch, cid)
    assert [m["id"] for m in shown["messages"]][-3:] == [
        regen["message_id"], after["user_message_id"], after["message_id"],
    ]  # fmt: skip
    await ws.disconnect()


async def test_a_conversation_can_be_renamed_by_its_owner(short_answers, member):
    ws, _, _ = await open_socket("/ws/chat/", member)
    opening, _ = await _turn(ws, {"type": "send", "conversation": None, "content": "Hi."})
    await ws.send_json_to({"type": "rename", "conversation": opening["id"], "title": "  Plans  "})
    reply = await ws.receive_json_from(timeout=30)
    await ws.disconnect()
    assert reply == {"type": "renamed", "id": opening["id"], "title": "Plans"}
    assert (await db(Conversation.objects.get, pk=opening["id"])).title == "Plans"


# --- long chats ----------------------------------------------------------------------------------


async def test_a_three_hour_chat_outgrows_the_context_and_goes_on(short_answers, member):
    """Turn after turn of long questions in a 1024-token context: older turns are left out in
    steps, every turn is answered, and the turns between steps reuse the prefix cache."""
    short_answers.n_ctx = 1024
    await db(short_answers.save)
    ws, _, _ = await open_socket("/ws/chat/", member)
    cid, seen = None, []
    for n in range(14):
        question = f"Note {n}: " + "the garden needs water and the shed needs paint. " * 6
        frame = {"type": "send", "conversation": cid, "system_prompt": "Be brief."}
        opening, frames = await _turn(ws, {**frame, "content": question})
        cid = opening["id"]
        final = frames[-1]
        assert final["type"] == "done", final
        seen.append((opening["left_out"], opening["context_start"], final["figures"]))
    await ws.disconnect()

    left_out = [entry[0] for entry in seen]
    assert left_out[0] == 0 and left_out[-1] > 0, left_out
    starts = [entry[1] for entry in seen]
    steps = [i for i in range(1, len(starts)) if starts[i] != starts[i - 1]]
    assert steps and len(steps) < len(starts) // 2, starts  # it moves in steps, not every turn
    between = [seen[i][2] for i in range(1, len(seen)) if i not in steps and starts[i]]
    assert between, starts
    for figures in between:  # same start as the turn before: its prompt is mostly cached
        assert figures["cached_tokens"] > figures["prompt_tokens"] // 2, figures
    conversation = await db(Conversation.objects.get, pk=cid)
    assert conversation.context_start_id == starts[-1]
    assert await db(lambda: conversation.messages.count()) == 28  # nothing was deleted


# --- thinking ------------------------------------------------------------------------------------


async def test_a_thinking_models_thoughts_stream_apart_and_are_saved_apart(starter_model, member):
    from tests.inference.text.thinking_templates import FEW_SHOT

    # The starter model's weights under a template that makes it write a <think> block first.
    starter_model.chat_template_override = FEW_SHOT
    starter_model.default_params = {"max_tokens": 60, "temperature": 0.0}
    await db(starter_model.save)
    ws, _, _ = await open_socket("/ws/chat/", member)
    opening, frames = await _turn(ws, {"type": "send", "conversation": None, "content": "Hi"})
    await ws.disconnect()

    thought = "".join(f["text"] for f in frames if f["type"] == "thinking")
    said = streamed_text(frames)
    assert thought and said, frames
    assert "<think>" not in said and "</think>" not in said
    kinds = [f["type"] for f in frames]
    assert kinds.index("thinking") < kinds.index("token")  # it thinks first
    final = frames[-1]
    assert (final["thinking"], final["text"]) == (thought, said)
    assert final["figures"]["thinking_s"] >= 0
    answer = await db(_message, opening["message_id"])
    assert (answer.thinking, answer.content) == (thought, said)
