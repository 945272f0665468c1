"""A running chat answer's priority follows whether anyone reads it (dashboard.chat.running),
told to a stand-in inference client; the real engine's side is in test_chat_turns."""

import asyncio

import pytest

from dashboard.chat.running import Turn
from inference.engine import GenerationRequest, SamplingParams
from inference.serving import client as client_module
from inference.serving.client import set_client


class PriorityLog:
    """The one call of an inference client that a turn's priority makes; a slow one, so that
    changes pile up while it is being told."""

    def __init__(self):
        self.told: list[tuple[str, str]] = []

    async def set_priority(self, request_id: str, priority: str) -> None:
        await asyncio.sleep(0.01)
        self.told.append((request_id, priority))


@pytest.fixture
def priority_log():
    previous = client_module._client
    log = PriorityLog()
    set_client(log)
    yield log
    set_client(previous)


def a_turn() -> Turn:
    request = GenerationRequest("hi", SamplingParams(max_tokens=8), model="m")
    return Turn(conversation_id=1, user_id=1, title="t", model_name="m", message_id=1,
                user_message_id=None, replaced_message_id=None, truncate_from=None,
                username="alice", request=request, spec=None)  # fmt: skip


def reader(frame: dict) -> None:
    pass


async def _told(turn: Turn) -> None:
    while turn.telling is not None and not turn.telling.done():
        await asyncio.sleep(0.01)


async def test_the_last_reader_leaving_makes_the_answer_background_and_one_coming_back_not(
    priority_log,
):
    turn = a_turn()
    turn.subscribe(reader, replay=False)
    turn.in_engine = True
    turn.unsubscribe(reader)
    await _told(turn)
    assert priority_log.told == [(turn.request_id, "background")]

    turn.subscribe(reader, replay=False)
    await _told(turn)
    assert priority_log.told[-1] == (turn.request_id, "interactive")


async def test_a_quick_reload_ends_with_the_engine_holding_interactive(priority_log):
    turn = a_turn()
    turn.in_engine = True
    turn.subscribe(reader, replay=False)
    turn.unsubscribe(reader)
    await asyncio.sleep(0)  # "background" is being told...
    for _ in range(3):  # ...while the page is opened and closed again
        turn.subscribe(reader, replay=False)
        turn.unsubscribe(reader)
    turn.subscribe(reader, replay=False)
    await _told(turn)
    assert [priority for _, priority in priority_log.told] == ["background", "interactive"]
    assert turn.told == "interactive"


async def test_nothing_is_told_before_the_engine_has_the_request_or_after_the_answer_ended(
    priority_log,
):
    waiting = a_turn()
    waiting.subscribe(reader, replay=False)
    waiting.unsubscribe(reader)  # the model is still loading: the engine has nothing to change
    assert waiting.telling is None

    ended = a_turn()
    ended.in_engine = True
    ended.subscribe(reader, replay=False)
    ended.final = {"type": "done"}
    ended.unsubscribe(reader)
    assert ended.telling is None
    assert priority_log.told == []
