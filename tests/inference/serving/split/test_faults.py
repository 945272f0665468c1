"""Split mode when things break: a worker killed mid-answer, no worker at all, no Redis.

Every wait has a generous deadline: the claim is "a clear error event and no hang", never a
speed."""

import asyncio

import pytest

from inference.serving.split_client import SplitClient, WorkerError
from tests.split.fixtures import no_workers_left
from tests.split.streams import collect, counting, eventually, short, tokens
from tests.split.workers import REDIS_URL

pytestmark = [pytest.mark.redis, pytest.mark.model]

CLOSED_PORT_URL = "redis://127.0.0.1:6390/0"  # nothing listens there
NO_HANG_S = 60  # "within seconds" on a shared 2-core box, with room to spare


async def test_killing_the_worker_mid_stream_gives_a_clear_error_and_a_new_worker_serves(
    split_client, spec, start_worker
):
    worker = start_worker()

    async def kill_after_three_tokens(event, events):
        if event["type"] == "token" and len(tokens(events)) == 3:
            await asyncio.to_thread(worker.kill)

    events = await collect(split_client, counting(), spec, on_event=kill_after_three_tokens)

    error = events[-1]
    assert error["type"] == "error", error
    assert error["code"] == "unavailable"
    assert "the inference worker stopped while answering" in error["message"]
    assert len(tokens(events)) >= 3  # what had streamed stays streamed

    start_worker()
    after = await collect(split_client, short(), spec)
    assert after[-1]["type"] == "done", after[-1]
    assert tokens(after)


async def test_a_runner_killed_under_the_worker_ends_the_answer_and_the_worker_serves_on(
    split_client, spec, start_worker
):
    import os
    import signal

    worker = start_worker()
    await collect(split_client, short(), spec)

    def runners() -> list[dict]:
        return [r for s in split_client.snapshots() for r in s["runners"] if r["pid"]]

    assert await eventually(lambda: len(runners()) == 1)  # the worker's snapshot names it
    (runner,) = runners()
    # A host whose CPU faults with llama.cpp's extra buffer types (AMX) restarted it once
    # already, in the CPU self-check: count from here.
    restarts_before = runner["restarts"]

    async def segfault_after_three_tokens(event, events):
        if event["type"] == "token" and len(tokens(events)) == 3:
            os.kill(runner["pid"], signal.SIGSEGV)

    events = await collect(split_client, counting(), spec, on_event=segfault_after_three_tokens)
    error = events[-1]
    assert error["type"] == "error" and error["code"] == "unavailable"
    assert "was killed by signal 11 (SIGSEGV) during decode" in error["message"]
    assert len(tokens(events)) >= 3

    after = await collect(split_client, short(), spec)  # the same worker, a new runner
    assert after[-1]["type"] == "done", after[-1]
    assert worker.process.poll() is None
    assert await eventually(lambda: [r["restarts"] for r in runners()] == [restarts_before + 1])
    assert runners()[0]["pid"] != runner["pid"]


async def test_a_request_sent_while_no_worker_runs_waits_and_is_served_once_one_starts(
    split_mode, spec, start_worker
):
    no_workers_left(split_mode)
    patient = SplitClient(REDIS_URL, worker_wait_s=300)
    waiting = asyncio.create_task(collect(patient, short(), spec))

    assert await eventually(lambda: split_mode.llen("inference") >= 1)
    assert not waiting.done()
    start_worker()
    events = await waiting

    assert events[-1]["type"] == "done", events[-1]
    assert tokens(events)


async def test_with_no_worker_running_a_request_ends_in_a_clear_error(split_mode, spec):
    no_workers_left(split_mode)
    impatient = SplitClient(REDIS_URL, worker_wait_s=2)

    (error,) = await collect(impatient, short(), spec, timeout=NO_HANG_S)

    assert error["type"] == "error"
    assert error["code"] == "unavailable"
    assert error["message"] == "no inference worker is running"


async def test_a_request_given_up_while_queued_is_not_run_by_a_later_worker(
    split_mode, spec, start_worker
):
    no_workers_left(split_mode)
    impatient = SplitClient(REDIS_URL, worker_wait_s=1)
    abandoned = short()
    (error,) = await collect(impatient, abandoned, spec, timeout=NO_HANG_S)
    assert error["type"] == "error"

    worker = start_worker()
    assert await eventually(lambda: split_mode.llen("inference") == 0)
    assert await eventually(lambda: f"{abandoned.request_id}: nobody waits" in worker.log())


async def test_an_unreachable_broker_gives_an_unavailable_error_within_seconds(settings, spec):
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [CLOSED_PORT_URL]},
        }
    }
    unreachable = SplitClient(CLOSED_PORT_URL)

    (error,) = await collect(unreachable, short(), spec, timeout=NO_HANG_S)

    assert error["type"] == "error"
    assert error["code"] == "unavailable"
    assert error["message"].startswith("the message broker (Redis) is unreachable: ")
    async with asyncio.timeout(NO_HANG_S):
        assert await asyncio.to_thread(unreachable.snapshots) == []
        with pytest.raises(WorkerError, match="unreachable"):
            await unreachable.load(spec)
        await unreachable.cancel("no-such-request")  # logs, never raises
