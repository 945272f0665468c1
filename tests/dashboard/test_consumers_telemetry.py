"""The live dashboard's WebSocket: staff only, panels pushed a few times a second."""

import asyncio

import pytest
from channels.layers import get_channel_layer

from dashboard.web import telemetry
from inference.serving.feed import publish
from tests.dashboard.web.sockets import open_socket, until_final
from tests.inference import conftest as registry

# A models directory with a tiny model in it, as the registry's tests make them.
models_dir = registry.models_dir
tiny_file = registry.tiny_file

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]

PANEL_FIELDS = {
    "worker", "mode", "time", "loading", "loaded", "prompt_tps", "output_tps", "ttft", "itl",
    "queue_depth", "active_sequences", "kv_fill", "cpu_percent", "memory", "models", "finished",
    "now", "windows", "streams", "shares", "apps", "box",
}  # fmt: skip


@pytest.fixture
def fast_telemetry(settings):
    settings.TELEMETRY_INTERVAL_S = 0.1


async def next_snapshot(ws, timeout: float = 30) -> dict:
    frame = await ws.receive_json_from(timeout=timeout)
    assert frame["type"] == "snapshot"
    return frame["panels"]


async def test_it_refuses_an_anonymous_dashboard_socket():
    _, connected, code = await open_socket("/ws/telemetry/")
    assert not connected
    assert code == 4401


async def test_it_refuses_a_user_who_is_not_staff(member):
    _, connected, code = await open_socket("/ws/telemetry/", member)
    assert not connected
    assert code == 4403


async def test_it_refuses_a_foreign_origin_even_for_staff(admin_user):
    _, connected, _ = await open_socket("/ws/telemetry/", admin_user, origin="http://evil.example")
    assert not connected


async def test_staff_receive_snapshots_with_every_panel(admin_user, fast_telemetry):
    ws, connected, _ = await open_socket("/ws/telemetry/", admin_user)
    assert connected
    first = await next_snapshot(ws)
    second = await next_snapshot(ws)
    await ws.disconnect()

    assert PANEL_FIELDS <= set(first)
    assert first["mode"] == "embedded"
    assert second["time"] >= first["time"]
    assert set(first["ttft"]) == set(first["itl"]) == {"p50", "p95", "p99", "max"}
    memory = first["memory"]
    assert memory["kind"] in ("gpu", "ram")
    assert memory["rss_bytes"] > 0
    if memory["kind"] == "gpu":
        assert all(g["total_bytes"] >= g["used_bytes"] > 0 for g in memory["gpus"])


@pytest.mark.model
async def test_the_throughput_panels_show_a_chat_that_just_ran(
    starter_model, member, admin_user, fast_telemetry
):
    starter_model.default_params = {"max_tokens": 24}
    await asyncio.to_thread(starter_model.save)
    chat, _, _ = await open_socket("/ws/chat/", member)
    await chat.send_json_to({"type": "send", "conversation": None, "content": "Hello!"})
    frames = await until_final(chat)
    await chat.disconnect()
    assert frames[-1]["type"] == "done"

    ws, _, _ = await open_socket("/ws/telemetry/", admin_user)
    panels = await next_snapshot(ws)
    await ws.disconnect()
    model = panels["models"][starter_model.name]
    # Prefill and decode reported as two separate series, both moved by the chat.
    assert panels["prompt_tps"] > 0 and panels["output_tps"] > 0
    assert model["prompt_tps"] == panels["prompt_tps"]
    assert panels["ttft"]["p50"] > 0 and panels["itl"]["p50"] > 0
    assert model["slots"] >= starter_model.parallel
    assert model["finished"] >= 1
    assert starter_model.name in [row["name"] for row in panels["loaded"]]
    # The window picker's figures: the chat is in every window, its steps in the step panel.
    for key in ("30", "300", "3600"):
        window = panels["windows"][key]
        assert window["output_tps"] > 0 and window["ttft"]["count"] >= 1
        assert window["itl"]["p50"] > 0 and len(window["series"]["output_tps"]) == 30
    steps = model["steps"]
    assert sum(steps["prompt"]) > 0 and sum(steps["decode"]) > 0
    assert len({len(column) for column in steps.values() if column is not None}) == 1
    assert panels["streams"] == []  # it has ended: nothing is listed as running


class WorkersPublish:
    """A client whose engines live in other processes (split mode): they publish, not this one."""

    mode = "split"
    publishes_telemetry = False

    def snapshots(self) -> list[dict]:
        return []


async def test_it_relays_what_a_split_mode_worker_publishes_and_starts_no_publisher(
    admin_user, monkeypatch
):
    monkeypatch.setattr(telemetry, "get_client", WorkersPublish)
    ws, _, _ = await open_socket("/ws/telemetry/", admin_user)
    snapshot = {
        "worker": "gpu-box", "mode": "split", "time": 1.0, "loading": None,
        "loaded": [{"name": "m", "size_bytes": 5, "busy": True, "expires_in": None}],
        "models": {"m": {"prompt_tps": 900.0, "output_tps": 40.0, "queue_depth": 2,
                         "active_sequences": 3, "kv_fill": 0.25, "slots": 4,
                         "ttft": {"p50": 0.2, "p95": 0.5, "p99": 0.9, "max": 1.0},
                         "itl": {"p50": 0.02, "p95": 0.03, "p99": 0.05, "max": 0.08},
                         "outcomes": {"stop": 3, "cancelled": 1},
                         "histograms": {"ttft": {"buckets": [0.1, float("inf")]}}}},
        "system": {"gpus": [{"index": 0, "name": "H200", "used_bytes": 10, "total_bytes": 100,
                             "process_bytes": 7, "utilization": 50}],
                   "rss_bytes": 3, "model_bytes": 5, "cpu_percent": 12.5, "cpu_count": 16},
    }  # fmt: skip
    await publish(get_channel_layer(), snapshot)
    panels = await next_snapshot(ws, timeout=5)
    assert await ws.receive_nothing(timeout=0.3)  # nothing of its own
    await ws.disconnect()

    assert asyncio.get_running_loop() not in telemetry._publishers
    assert panels["worker"] == "gpu-box"
    assert (panels["prompt_tps"], panels["output_tps"]) == (900.0, 40.0)
    assert (panels["queue_depth"], panels["active_sequences"], panels["finished"]) == (2, 3, 4)
    assert panels["memory"]["kind"] == "gpu"
    assert panels["memory"]["gpus"][0]["process_bytes"] == 7
    assert panels["cpu_percent"] == 12.5


async def test_the_publisher_stops_when_the_last_dashboard_closes(admin_user, fast_telemetry):
    first, _, _ = await open_socket("/ws/telemetry/", admin_user)
    second, _, _ = await open_socket("/ws/telemetry/", admin_user)
    await next_snapshot(first)
    publisher = telemetry._publishers[asyncio.get_running_loop()]
    assert publisher.subscribers == 2
    task = publisher.task
    await first.disconnect()
    await next_snapshot(second)  # still flowing for the one left
    await second.disconnect()
    assert publisher.subscribers == 0
    await asyncio.gather(task, return_exceptions=True)
    assert task.done()


async def test_the_apps_and_people_the_engine_names_by_id_reach_the_page_by_name(
    admin_user, member, monkeypatch
):
    from dashboard.models import ApiKey
    from dashboard.web import share_names

    monkeypatch.setattr(telemetry, "get_client", WorkersPublish)
    monkeypatch.setattr(share_names, "_kept", {})
    key, _ = await asyncio.to_thread(ApiKey.create, "paperless")
    ws, _, _ = await open_socket("/ws/telemetry/", admin_user)
    engine = {
        "streams": [{"id": "aaaa1111", "phase": "decoding", "priority": "interactive",
                     "share": f"user:{member.pk}", "paused": False}],
        "shares": [{"share": f"apikey:{key.pk}", "priority": "background", "running": 4,
                    "waiting": 8, "paused": 1, "tokens_recent": 900},
                   {"share": "apikey:999:user:someone", "priority": "interactive", "running": 1,
                    "waiting": 0, "paused": 0, "tokens_recent": 10}],
    }  # fmt: skip
    snapshot = {"worker": "gpu-box", "mode": "split", "time": 1.0, "models": {"m": engine}}
    await publish(get_channel_layer(), snapshot)
    first = await next_snapshot(ws, timeout=5)
    await publish(get_channel_layer(), snapshot)
    second = await next_snapshot(ws, timeout=5)  # from the names kept
    await ws.disconnect()

    assert first["apps"] == second["apps"] == {
        f"user:{member.pk}": member.username,
        f"apikey:{key.pk}": "paperless",
        "apikey:999:user:someone": "apikey:999:user:someone",  # no such key: the id as it is
    }
    assert first["shares"][0]["priority"] == "background"
    assert first["streams"][0]["share"] == f"user:{member.pk}"


async def test_each_snapshot_carries_its_workers_box_with_the_models_by_name(
    admin_user, fast_telemetry, models_dir, tiny_file
):
    from dashboard.web.boxes import forget
    from inference.catalog.importing import register_file

    model = await asyncio.to_thread(register_file, tiny_file, source="scan")
    forget()  # registered a moment ago: read the registry again
    ws, connected, _ = await open_socket("/ws/telemetry/", admin_user)
    assert connected
    box = (await next_snapshot(ws))["box"]
    await ws.disconnect()

    assert (box["worker"], box["state"]) == ("embedded", "ready")
    assert box["host"]
    mine = [m for m in box["models"] if m["name"] == model.name]
    assert mine == [{"name": model.name, "sha256": model.sha256, "loaded": False, "n_ctx": None,
                     "slots_total": None, "slots_free": None}]  # fmt: skip


async def test_a_closed_dashboard_socket_leaves_the_group(admin_user, monkeypatch):
    from inference.serving.feed import TELEMETRY_GROUP

    monkeypatch.setattr(telemetry, "get_client", WorkersPublish)
    layer = get_channel_layer()
    ws, _, _ = await open_socket("/ws/telemetry/", admin_user)
    assert len(layer.groups.get(TELEMETRY_GROUP, {})) == 1
    await ws.disconnect()

    assert not layer.groups.get(TELEMETRY_GROUP)
