"""Uploaded blobs that no /api/create made into a model are removed once their retention has
passed, never before, never while an upload still writes one, never a file a model uses."""

import hashlib
import os
import threading
import time

import pytest

from inference.catalog import blobs
from inference.jobs import tasks
from inference.models import LLMModel
from tests.inference.ggufs import tiny_gguf

pytestmark = pytest.mark.django_db

HOUR = 3600


@pytest.fixture
def retention(settings):
    settings.BLOB_RETENTION_HOURS = 2
    return 2 * HOUR


def uploaded(models_dir, tmp_path) -> tuple[str, bytes]:
    data = tiny_gguf(tmp_path / "src" / "tiny.gguf").read_bytes()
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    chunks = iter([data])
    blobs.receive(digest, lambda n: next(chunks, b""), len(data))
    return digest, data


def test_a_blob_no_model_was_made_of_goes_once_its_retention_has_passed(
    models_dir, tmp_path, retention
):
    digest, _ = uploaded(models_dir, tmp_path)
    written = blobs.blob_path(digest).stat().st_mtime
    kept = blobs.prune(now=written + retention - 60)
    assert kept.removed == [] and blobs.present(digest)
    assert kept.next_in == pytest.approx(60, abs=1)
    gone = blobs.prune(now=written + retention + 1)
    assert gone.removed == [blobs.blob_path(digest).name] and gone.next_in is None
    assert not blobs.present(digest)


def test_a_blob_made_into_a_model_is_not_touched(models_dir, tmp_path, retention):
    digest, _ = uploaded(models_dir, tmp_path)
    path = blobs.blob_path(digest)
    LLMModel.objects.create(name="kept-in-place", file_path=str(path), size_bytes=1)
    assert blobs.prune(now=time.time() + 10 * retention).removed == []
    assert path.is_file()


def test_an_upload_in_progress_is_never_removed_and_an_abandoned_one_is(
    models_dir, tmp_path, retention
):
    data = tiny_gguf(tmp_path / "src" / "tiny.gguf").read_bytes()
    digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
    first_half, release = threading.Event(), threading.Event()
    parts = [data[: len(data) // 2], data[len(data) // 2 :]]

    def read(n: int) -> bytes:  # a slow client: half the body, then a long pause
        if len(parts) == 1:
            first_half.set()
            release.wait(30)
        return parts.pop(0) if parts else b""

    upload = threading.Thread(target=blobs.receive, args=(digest, read, len(data)))
    upload.start()
    assert first_half.wait(30)
    later = time.time() + 10 * retention
    assert blobs.prune(now=later).removed == []  # its partial file is locked: in progress
    release.set()
    upload.join(30)
    assert blobs.present(digest)

    abandoned = blobs.blobs_dir() / ".body-abandoned.part"  # left by a process that died
    abandoned.write_bytes(b"GGUF")
    assert sorted(blobs.prune(now=later).removed) == sorted(
        [blobs.blob_path(digest).name, abandoned.name])  # fmt: skip


def test_the_task_removes_what_is_due_and_the_beat_runs_it_every_hour(
    models_dir, tmp_path, retention, settings
):
    from appliance.celery import app

    digest, _ = uploaded(models_dir, tmp_path)
    old = time.time() - retention - 60
    os.utime(blobs.blob_path(digest), (old, old))
    assert tasks.prune_blobs() == [blobs.blob_path(digest).name]
    schedule = {entry["task"]: entry["schedule"] for entry in
                settings.CELERY_BEAT_SCHEDULE.values()}  # fmt: skip
    assert schedule["inference.prune_blobs"] == 3600.0
    assert app.amqp.router.route({}, "inference.prune_blobs")["queue"].name == "jobs"


def test_without_a_beat_a_timer_comes_back_when_the_next_blob_is_due(
    models_dir, tmp_path, retention, settings
):
    settings.SPLIT_MODE = False
    digest, _ = uploaded(models_dir, tmp_path)
    try:
        tasks.keep_blobs_pruned()
        timer = tasks._blob_timer
        assert timer is not None and timer.is_alive()
        assert timer.interval == pytest.approx(retention, abs=5)
        blobs.blob_path(digest).unlink()
        tasks.keep_blobs_pruned()  # nothing left: no timer
        assert tasks._blob_timer is None and timer.finished.is_set()  # cancelled
    finally:
        if tasks._blob_timer is not None:
            tasks._blob_timer.cancel()
