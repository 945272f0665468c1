"""Every request's figures stored, read back for the dashboard, and pruned after retention."""

from datetime import timedelta

import pytest
from django.utils import timezone

from inference import history
from inference.models import RequestRecord

pytestmark = pytest.mark.django_db

FIGURES = {
    "queue_time": 0.01, "load_time": 0.0, "prompt_tokens": 120, "cached_tokens": 100,
    "output_tokens": 8, "prefill_time": 0.02, "prompt_tps": 1000.0, "ttft": 0.04,
    "itl": {"p50": 0.02, "p95": 0.03, "p99": 0.04, "max": 0.05}, "decode_tps": 45.0,
    "total_time": 0.3, "finish_reason": "stop",
    "timeline": [
        {"phase": "queue", "start": 0.0, "end": 0.01},
        {"phase": "prefill", "start": 0.01, "end": 0.03, "tokens": 20},
        {"phase": "decode", "start": 0.04, "end": 0.3},
    ],
}  # fmt: skip


def record(**overrides):
    fields = dict(request_id="r", model_name="m", source="chat", client="alice",
                  figures=FIGURES, outcome="stop") | overrides  # fmt: skip
    return history.record_request(**fields)


def test_it_stores_every_figure_in_its_own_column():
    saved = RequestRecord.objects.get(pk=record(accepted_wall=1000.0).pk)
    assert (saved.prompt_tokens, saved.cached_tokens, saved.output_tokens) == (120, 100, 8)
    assert (saved.ttft, saved.prompt_tps, saved.decode_tps) == (0.04, 1000.0, 45.0)
    assert (saved.itl_p50, saved.itl_p99, saved.itl_max) == (0.02, 0.04, 0.05)
    assert saved.figures["accepted_wall"] == 1000.0


def test_a_refused_request_is_stored_with_its_error():
    saved = record(figures={}, outcome="error", error="busy: 64 requests are waiting")
    assert (saved.outcome, saved.error, saved.ttft, saved.output_tokens) == (
        "error", "busy: 64 requests are waiting", None, 0,
    )  # fmt: skip


def test_a_split_mode_answer_is_stored_with_the_worker_that_answered_and_why():
    from inference.engine import GenerationRequest

    final = {"type": "done", "finish_reason": "stop", "figures": FIGURES,
             "route": {"worker": "inference@gaming-pc", "reason": "conversation"}}  # fmt: skip
    history.record_answer(GenerationRequest("hi", model="m"), final, source="openai", client="ha")
    saved = RequestRecord.objects.get()
    assert (saved.worker, saved.route) == ("inference@gaming-pc", "conversation")
    (row,) = history.recent_requests()
    assert (row["worker"], row["route"]) == ("inference@gaming-pc", "conversation")


def test_an_embedded_answer_names_no_worker():
    saved = record()
    assert (saved.worker, saved.route) == ("", "")


def test_recent_requests_come_newest_first_on_one_wall_clock_axis():
    record(request_id="old", accepted_wall=1000.0)
    record(request_id="new")  # no acceptance time: estimated from the save time
    rows = history.recent_requests()
    assert [r["request_id"] for r in rows] == ["new", "old"]
    assert rows[1]["start"] == 1000.0
    saved = RequestRecord.objects.get(request_id="new").created_at.timestamp()
    assert rows[0]["start"] == pytest.approx(saved - FIGURES["total_time"])
    assert rows[0]["timeline"] == FIGURES["timeline"]


def test_the_timeline_keeps_only_well_formed_phases():
    figures = FIGURES | {"timeline": [
        {"phase": "decode", "start": 0.1, "end": 0.2},
        {"phase": "<img src=x onerror=alert(1)>", "start": 0, "end": 1},
        {"phase": "queue", "start": "0", "end": 1},
        "not a phase",
    ]}  # fmt: skip
    record(figures=figures)
    timeline = history.recent_requests()[0]["timeline"]
    assert timeline == [{"phase": "decode", "start": 0.1, "end": 0.2}]


def test_a_request_with_images_keeps_its_encode_phase_and_says_what_it_took():
    encode = {"phase": "encode", "start": 0.0, "end": 0.18, "tokens": 64}
    queue = {"phase": "queue", "start": 0.18, "end": 0.19}
    figures = FIGURES | {"encode_time": 0.18, "image_tokens": 64,
                         "timeline": [encode, queue, *FIGURES["timeline"][1:]]}  # fmt: skip
    record(request_id="picture", figures=figures)
    record(request_id="text")
    text, picture = history.recent_requests()
    assert picture["timeline"][:2] == [encode, queue]
    assert (picture["encode_time"], picture["image_tokens"]) == (0.18, 64)
    assert (text["encode_time"], text["image_tokens"]) == (None, 0)


def test_pruning_deletes_only_records_older_than_the_retention(settings):
    settings.REQUEST_RETENTION_DAYS = 7
    keep = record(request_id="keep")
    drop = record(request_id="drop")
    RequestRecord.objects.filter(pk=drop.pk).update(created_at=timezone.now() - timedelta(days=8))
    RequestRecord.objects.filter(pk=keep.pk).update(created_at=timezone.now() - timedelta(days=6))
    assert history.prune_request_history() == 1
    assert list(RequestRecord.objects.values_list("request_id", flat=True)) == ["keep"]
    assert history.prune_request_history() == 0


def test_saving_a_record_prunes_now_and_then_without_a_scheduler(settings, monkeypatch):
    settings.REQUEST_RETENTION_DAYS = 1
    stale = record(request_id="stale")
    RequestRecord.objects.filter(pk=stale.pk).update(created_at=timezone.now() - timedelta(days=2))
    monkeypatch.setattr(history, "_last_prune", 0.0)  # as in a freshly started process
    record(request_id="fresh")
    assert list(RequestRecord.objects.values_list("request_id", flat=True)) == ["fresh"]
