"""A running request's priority changed from the web side, through Redis, in a real inference
worker (SplitClient.set_priority -> appliance:priority -> worker_state -> the runner's engine)."""

import asyncio

import pytest

from inference.serving import split_protocol as protocol
from tests.split.streams import collect, counting, eventually, tokens


def _priorities(split_client, model: str) -> list[str]:
    snapshots = split_client.snapshots()
    streams = snapshots[0]["models"].get(model, {}).get("streams") if snapshots else None
    return [row["priority"] for row in streams or []]


@pytest.mark.redis
@pytest.mark.model
async def test_a_priority_set_from_the_web_side_reaches_the_worker_answering_the_request(
    split_client, spec, shared_worker
):
    generation = counting(max_tokens=900)
    started = asyncio.Event()

    async def note_the_first_tokens(event, events):
        if len(tokens(events)) == 2:
            started.set()

    answer = asyncio.create_task(collect(split_client, generation, spec,
                                         on_event=note_the_first_tokens))  # fmt: skip
    try:
        await asyncio.wait_for(started.wait(), 180)
        assert await eventually(lambda: _priorities(split_client, spec.name) == ["interactive"])

        await split_client.set_priority(generation.request_id, "background")
        assert await eventually(lambda: _priorities(split_client, spec.name) == ["background"])

        # A request no worker has, and a message that is not one, change nothing.
        await split_client.set_priority("not-on-any-worker", "interactive")
        split_client.redis.publish(protocol.priority_channel(split_client.redis), "garbled")
        await split_client.set_priority(generation.request_id, "interactive")
        assert await eventually(lambda: _priorities(split_client, spec.name) == ["interactive"])
    finally:
        await split_client.cancel(generation.request_id)
        events = await answer
    assert events[-1]["type"] == "done" and events[-1]["finish_reason"] == "cancelled"


def test_a_priority_message_is_read_back_and_anything_else_is_dropped():
    message = protocol.priority_message("abc", "background")
    assert protocol.read_priority(message) == ("abc", "background")
    for garbled in ("garbled", "[]", '{"request_id": "abc", "priority": "urgent"}',
                    '{"request_id": "", "priority": "background"}',
                    '{"request_id": 7, "priority": "background"}'):  # fmt: skip
        assert protocol.read_priority(garbled) is None, garbled


def test_a_priority_that_comes_while_the_model_loads_is_applied_when_the_engine_has_it():
    from inference.engine.events import RequestHandle
    from inference.serving.worker_state import Running

    told = []
    running = Running("r1")
    running.set_priority("background")  # no handle yet: the model is still loading
    running.attach(RequestHandle("r1", lambda _: None, set_priority=lambda *a: told.append(a)))
    running.set_priority("interactive")
    assert told == [("r1", "background"), ("r1", "interactive")]
