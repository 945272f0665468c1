"""Split mode when the broker restarts: Redis killed with an answer in flight and started again
on the same port, empty, as a restarted container comes back. Only the answers in flight are
lost: the inference worker reconnects and serves again, and so do the web side's parts (the
SplitClient's publishing, the channel layer, the chat and dashboard sockets).

The broker is a private redis-server (redis_server.py): the suite's Redis stays up."""

import asyncio

import pytest
from channels.db import database_sync_to_async

from tests.dashboard.web.sockets import open_socket, until_final
from tests.split.fixtures import split_client_on, split_web_process
from tests.split.redis_server import RedisServer
from tests.split.streams import collect, counting, eventually, short, tokens
from tests.split.workers import WorkerProcess

pytestmark = [pytest.mark.redis, pytest.mark.model]

DOWN_S = 3  # how long Redis stays down: the measurement
ANSWERED_WITHIN_S = 10  # the goal, counted from Redis being back


@pytest.fixture(scope="module")
def broker():
    server = RedisServer().start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def worker(tmp_path_factory, broker):
    """One worker for the module, as docker-compose.yml runs it: it must outlive every
    restart."""
    workdir = tmp_path_factory.mktemp("broker-restart")
    process = WorkerProcess(workdir, broker.url, chatter=True).start()
    process.wait_until_alive()
    yield process
    process.stop()


@pytest.fixture
def web(settings, broker):
    """This process as a split-mode web process on the private broker."""
    with split_web_process(settings, broker.url), split_client_on(broker.url) as client:
        yield client


async def restart(broker: RedisServer) -> float:
    """Kill the broker, keep it down DOWN_S, start it again; the loop's time it was back."""
    await asyncio.to_thread(broker.kill)
    await asyncio.sleep(DOWN_S)
    await asyncio.to_thread(broker.start)
    return asyncio.get_running_loop().time()


def _snapshot_workers(client) -> list[str]:
    return [snapshot["worker"] for snapshot in client.snapshots()]


async def test_the_answer_in_flight_ends_with_a_clear_error_and_the_worker_serves_again(
    web, spec, broker, worker
):
    await collect(web, short(), spec)  # the model is loaded: the next answer streams at once
    restarted: list[asyncio.Task] = []

    async def restart_after_three_tokens(event, events):
        if event["type"] == "token" and len(tokens(events)) == 3:
            restarted.append(asyncio.create_task(restart(broker)))

    events = await collect(web, counting(), spec, on_event=restart_after_three_tokens)
    back = await restarted[0]
    answer = await collect(web, short(), spec, timeout=60)
    answered_after = asyncio.get_running_loop().time() - back

    error = events[-1]
    assert error["type"] == "error", error
    assert error["code"] == "unavailable"
    assert error["message"].startswith("the message broker (Redis) is unreachable"), error
    assert answer[-1]["type"] == "done", answer[-1]
    assert tokens(answer)
    assert answered_after < ANSWERED_WITHIN_S
    assert worker.process.poll() is None, worker.log()
    assert "Unrecoverable error" not in worker.log()


async def test_the_worker_is_seen_again_and_rides_out_a_second_restart(web, spec, broker, worker):
    await restart(broker)
    # Its heartbeat and its snapshot, which SplitClient.snapshots() reads only beside it.
    seen = await eventually(lambda: _snapshot_workers(web) == [worker.name],
                            timeout=ANSWERED_WITHIN_S)  # fmt: skip
    assert seen

    await restart(broker)
    answer = await collect(web, short(), spec, timeout=60)

    assert answer[-1]["type"] == "done", answer[-1]
    assert worker.process.poll() is None, worker.log()


@pytest.mark.django_db(transaction=True)
async def test_chat_and_dashboard_sockets_open_across_a_restart_work_again(
    web, starter_model, member, admin_user, broker, worker
):
    starter_model.default_params = {"max_tokens": 12, "temperature": 0.0}
    await database_sync_to_async(starter_model.save)()
    chat, connected, _ = await open_socket("/ws/chat/", member)
    assert connected
    dashboard, connected, _ = await open_socket("/ws/telemetry/", admin_user)
    assert connected
    assert (await dashboard.receive_json_from(timeout=60))["type"] == "snapshot"

    await asyncio.to_thread(broker.kill)
    await asyncio.sleep(DOWN_S)
    while not await dashboard.receive_nothing(timeout=0.2):  # what was sent before the loss
        await dashboard.receive_from()
    await asyncio.to_thread(broker.start)

    await chat.send_json_to({"type": "send", "conversation": None, "content": "Say hello."})
    frames = [await chat.receive_json_from(timeout=30), *await until_final(chat)]
    snapshot = await dashboard.receive_json_from(timeout=ANSWERED_WITHIN_S)
    await chat.disconnect()
    await dashboard.disconnect()

    assert frames[0]["type"] == "conversation"
    assert frames[-1]["type"] == "done", frames[-1]
    assert snapshot["type"] == "snapshot"
    assert snapshot["panels"]["worker"] == worker.name
