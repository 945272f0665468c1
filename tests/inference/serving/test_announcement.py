import json

import pytest

from inference.serving.announcement import LoadedModel, ServedModel, WorkerAnnouncement

SHA = "ab" * 32


def announcement(**changes) -> WorkerAnnouncement:
    fields = {
        "worker": "inference@nas", "instance": "1" * 32, "host": "nas",
        "queue": "inference.inference@nas",
        "serves": (ServedModel(SHA, 98_000_000),),
        "loaded": (LoadedModel("smollm2", SHA, 2048, 8, 6, 2, 0),),
        "queue_depth": 0, "running": 2, "ram_free_bytes": 4 << 30, "vram_free_bytes": None,
        "time": 1_700_000_000.5,
    }  # fmt: skip
    return WorkerAnnouncement(**{**fields, **changes})


def test_it_survives_json_unchanged():
    sent = announcement(vram_free_bytes=8 << 30)
    assert WorkerAnnouncement.from_json(sent.to_json()) == sent


def test_it_names_the_conversations_it_keeps_by_digest_and_reads_a_worker_without_any():
    sent = announcement(warm=("0123456789abcdef",))
    assert WorkerAnnouncement.from_json(sent.to_json()).warm == ("0123456789abcdef",)
    older = json.loads(announcement().to_json())
    del older["warm"]
    assert WorkerAnnouncement.from_json(json.dumps(older)).warm == ()


def test_it_tells_served_and_loaded_models_by_digest():
    sent = announcement()
    assert sent.serves_sha(SHA) and not sent.serves_sha("cd" * 32)
    assert sent.loaded_sha(SHA).name == "smollm2"
    assert sent.loaded_sha("") is None


@pytest.mark.parametrize(
    "change",
    [
        {"worker": ""},
        {"queue_depth": -1},
        {"running": True},
        {"ram_free_bytes": "lots"},
        {"vram_free_bytes": 1.5},
        {"time": None},
        {"serves": [{"sha256": "not a digest", "size_bytes": 1}]},
        {"serves": [{"sha256": SHA.upper(), "size_bytes": 1}]},
        {"loaded": [{"name": "x", "sha256": SHA}]},
        {"loaded": "smollm2"},
        {"warm": ["conv-1"]},
        {"warm": "0123456789abcdef"},
        {"warm": ["0123456789abcdef"] * 1025},
    ],
)
def test_it_refuses_a_garbled_field(change):
    data = {**json.loads(announcement().to_json()), **change}
    with pytest.raises(ValueError):
        WorkerAnnouncement.from_json(json.dumps(data))


@pytest.mark.parametrize("text", ["", "not json", "[]", "{}", b"\xff"])
def test_it_refuses_what_is_no_announcement(text):
    with pytest.raises(ValueError):
        WorkerAnnouncement.from_json(text)
