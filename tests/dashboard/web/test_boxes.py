"""The dashboard's Boxes panel: a worker's box from its telemetry panels and its announcement,
its files named from the registry, the embedded mode's one box; and /healthz and /api/ps
naming the workers."""

import time

import pytest

from dashboard.web.boxes import box_panel, forget
from dashboard.web.panels import panels
from inference.serving.announcement import LoadedModel, ServedModel, WorkerAnnouncement

SHA_A = "a" * 64
SHA_B = "b" * 64
SHA_C = "c" * 64
GiB = 1 << 30


def announcement(**fields) -> WorkerAnnouncement:
    values = dict(
        worker="inference@gpu-box", instance="i1", host="gpu-box",
        queue="inference.inference@gpu-box",
        serves=(ServedModel(SHA_A, 100), ServedModel(SHA_B, 200), ServedModel(SHA_C, 300)),
        loaded=(LoadedModel("qwen", SHA_B, 4096, 4, 3, 1, 0),),
        queue_depth=2, running=1, ram_free_bytes=8 * GiB, vram_free_bytes=6 * GiB,
        time=time.time(),
    )  # fmt: skip
    values.update(fields)
    return WorkerAnnouncement(**values)


def snapshot(worker: str, mode: str = "split", **fields) -> dict:
    return {"worker": worker, "mode": mode, "time": time.time(), "loaded": [], "models": {},
            "runners": [], "system": {"ram_available_bytes": 3 * GiB}, **fields}  # fmt: skip


def test_a_box_names_its_files_from_the_registry_with_the_loaded_ones_first():
    names = {SHA_A: ["smollm2"], SHA_B: ["qwen", "qwen-alias"]}
    box = box_panel(panels(snapshot("inference@gpu-box")), announcement(), names, [])

    assert (box["worker"], box["host"], box["state"]) == ("inference@gpu-box", "gpu-box", "ready")
    assert [(m["name"], m["loaded"]) for m in box["models"]] == [
        ("qwen, qwen-alias", True),
        ("smollm2", False),
        (f"a file not registered here (sha256 {SHA_C[:12]}…)", False),
    ]
    assert box["models"][0] == {"name": "qwen, qwen-alias", "sha256": SHA_B, "loaded": True,
                                     "n_ctx": 4096, "slots_total": 4, "slots_free": 3}  # fmt: skip
    assert (box["running"], box["queue_depth"]) == (1, 2)
    assert (box["ram_free_bytes"], box["vram_free_bytes"]) == (8 * GiB, 6 * GiB)


def test_a_box_says_what_it_is_loading_and_which_runner_failed():
    loading = panels(snapshot("w", loading="qwen"))
    assert box_panel(loading, announcement(), {}, [])["state"] == "loading qwen"

    failing = panels(snapshot("w", runners=[{"model": "qwen", "state": "backing off"}]))
    box = box_panel(failing, announcement(), {}, [])
    assert box["state"] == "refusing qwen: its runner failed"
    assert box["runners"] == [{"model": "qwen", "state": "backing off"}]


def test_the_embedded_mode_is_one_box_with_every_model_whose_file_is_here():
    snap = snapshot("embedded", mode="embedded", loaded=[{"name": "qwen", "size_bytes": 1}],
                    models={"qwen": {"slots": 4, "active_sequences": 1}})  # fmt: skip
    here = [("qwen", SHA_B), ("smollm2", SHA_A)]
    box = box_panel(panels(snap), None, {}, here)

    assert box["host"]  # this machine's name
    assert [(m["name"], m["loaded"], m["slots_free"]) for m in box["models"]] == [
        ("qwen", True, 3), ("smollm2", False, None),
    ]  # fmt: skip
    assert (box["ram_free_bytes"], box["vram_free_bytes"]) == (3 * GiB, None)


def test_a_worker_that_announces_nothing_yet_shows_its_loaded_models_only():
    snap = snapshot("inference@new", loaded=[{"name": "qwen", "size_bytes": 1}])
    box = box_panel(panels(snap), None, {}, [("smollm2", SHA_A)])
    assert [m["name"] for m in box["models"]] == ["qwen"]  # the web box's files are not its own
    assert box["host"] == ""


# --- /healthz and /api/ps name the workers ---------------------------------------------------


class TwoBoxes:
    """A split-mode client whose two workers both hold qwen; the NAS also has smollm2 loaded."""

    mode = "split"

    def snapshots(self):
        return [
            snapshot("inference@nas", loaded=[{"name": "qwen", "size_bytes": 10},
                                              {"name": "smollm2", "size_bytes": 5}]),
            snapshot("inference@gpu-box", loaded=[{"name": "qwen", "size_bytes": 10}]),
        ]  # fmt: skip

    def announcements(self):
        return [announcement(), announcement(worker="inference@nas", host="nas")]

    def live_workers(self):
        return ["inference@gpu-box", "inference@nas"]


@pytest.fixture
def two_boxes(settings):
    from inference.serving import client as client_module

    shared = client_module.get_client()
    settings.SPLIT_MODE = True
    settings.REDIS_URL = "redis://127.0.0.1:6379/14"
    client_module.set_client(TwoBoxes())
    forget()
    yield
    client_module.set_client(shared)
    forget()


@pytest.mark.django_db
@pytest.mark.redis
def test_healthz_lists_each_worker_with_its_host_and_loaded_models(client, two_boxes):
    body = client.get("/healthz").json()
    assert [(w["worker"], w["host"], w["alive"], w["models"]) for w in body["workers"]] == [
        ("inference@gpu-box", "gpu-box", True, ["qwen"]),
        ("inference@nas", "nas", True, ["qwen", "smollm2"]),
    ]
    assert body["models"] == ["qwen", "smollm2"]


@pytest.mark.django_db
def test_healthz_names_this_box_in_embedded_mode(client):
    (worker,) = client.get("/healthz").json()["workers"]
    assert (worker["worker"], worker["alive"]) == ("embedded", True)
    assert worker["host"] and isinstance(worker["models"], list)


@pytest.mark.django_db
def test_api_ps_reports_each_model_once_with_the_workers_that_hold_it(client, two_boxes):
    from dashboard.models import ApiKey

    _, raw = ApiKey.create("ps-app")
    rows = client.get("/api/ps", headers={"Authorization": f"Bearer {raw}"}).json()["models"]
    assert {row["name"]: row["workers"] for row in rows} == {
        "qwen:latest": ["inference@nas", "inference@gpu-box"],
        "smollm2:latest": ["inference@nas"],
    }
    # Ollama's own fields are all still there.
    assert {"name", "model", "size", "digest", "details", "expires_at", "size_vram"} <= set(rows[0])
