"""The models pages as a household uses them: one load state, the KV size explained, settings
applied with one click (never cutting an answer off), failures in plain words, failed jobs
retried or dismissed, and one entry per file."""

import hashlib
import re
import threading

import pytest
from django.urls import reverse

from inference.catalog.importing import hash_model_job, register_file
from inference.catalog.specs import spec_for
from inference.engine.params import SamplingParams
from inference.models import Job, LLMModel
from tests.dashboard.model_pages.conftest import flashes
from tests.dashboard.model_pages.test_settings_form import VALID
from tests.dashboard.model_pages.test_upload import upload
from tests.inference.engine.fakes import ask, wait_until
from tests.inference.ggufs import tiny_gguf

pytestmark = pytest.mark.django_db


def detail(client, model) -> str:
    return client.get(reverse("model-detail", args=[model.name])).content.decode()


def load(client, model):
    return client.post(reverse("model-load", args=[model.name]))


def loaded_config(fake_engine, model):
    return fake_engine.host._loaded[model.name].spec.config


def busy(fake_engine, model):
    """An answer that runs until the returned gate is set."""
    (runner,) = fake_engine.runners[-1:]
    runner.gate = threading.Event()
    handle = fake_engine.host.submit(spec_for(model), ask("hi", SamplingParams(max_tokens=2)))
    assert wait_until(runner.executing.is_set)
    return runner.gate, handle


# 1. One load state.


def test_the_badge_and_the_load_line_say_the_same_from_one_snapshot(staff, tiny_model,
                                                                    fake_engine):  # fmt: skip
    page = detail(staff, tiny_model)
    assert ">not loaded</span>" in page
    assert re.search(r'id="load-state"[^>]*>Not loaded: it loads on its first request', page)
    # Loaded by a request, not the button: loaded on both, and nothing claims "not loaded yet".
    fake_engine.host.load(spec_for(tiny_model))
    page = detail(staff, tiny_model)
    assert ">loaded</span>" in page and "not loaded yet" not in page
    assert re.search(r'id="load-state"[^>]*>Loaded \d+s ago', page)
    assert "not measured yet: a load with the Load button measures it" in page
    status = staff.get(reverse("models-status")).json()
    (row,) = status["loaded"]
    assert row["name"] == tiny_model.name and row["summary"].startswith("Loaded ")


def test_the_kv_line_says_where_its_size_comes_from(staff, tiny_model, settings):
    tiny_model.n_ctx, tiny_model.parallel = 256, 2
    tiny_model.save()
    assert (
        "256 tokens per sequence × 2 sequences (2 answering at once; finished turns are kept "
        "in RAM and on disk) = 512 tokens, f16"
    ) in detail(staff, tiny_model)
    settings.PROMPT_CACHE_RAM = 0  # warm memory off: finished turns keep slots of their own
    assert (
        "256 tokens per sequence × 4 sequences (2 answering at once + 2 kept for cached "
        "conversations) = 1024 tokens, f16"
    ) in detail(staff, tiny_model)


# 2. Apply and reload.


def test_save_and_reload_applies_load_settings_in_one_click(staff, tiny_model, fake_engine):
    load(staff, tiny_model)
    assert loaded_config(fake_engine, tiny_model).parallel == 8  # the default
    assert 'id="apply-reload"' in detail(staff, tiny_model)

    response = staff.post(reverse("model-apply", args=[tiny_model.name]), VALID)

    assert response.status_code == 302
    assert flashes(response)[-1].startswith(
        f"Settings of {tiny_model.name} saved and applied: reloaded"
    )
    assert loaded_config(fake_engine, tiny_model).parallel == 2
    assert len(fake_engine.runners) == 2  # a new runner with the new settings
    assert "Loaded with earlier settings" not in detail(staff, tiny_model)


def test_turning_speculation_off_is_applied_by_save_and_reload(staff, tiny_model, fake_engine):
    staff.post(reverse("model-apply", args=[tiny_model.name]), VALID)
    load(staff, tiny_model)
    assert loaded_config(fake_engine, tiny_model).speculative == "auto"

    response = staff.post(reverse("model-apply", args=[tiny_model.name]),
                          {**VALID, "speculative": "off"})  # fmt: skip

    assert flashes(response)[-1].startswith(
        f"Settings of {tiny_model.name} saved and applied: reloaded")  # fmt: skip
    assert loaded_config(fake_engine, tiny_model).speculative == "off"


def test_save_and_reload_skips_the_reload_when_nothing_needs_one(staff, tiny_model,
                                                                fake_engine):  # fmt: skip
    staff.post(reverse("model-apply", args=[tiny_model.name]), VALID)  # not loaded: saved
    load(staff, tiny_model)
    response = staff.post(reverse("model-apply", args=[tiny_model.name]),
                          {**VALID, "system_prompt": "Be kind."})  # fmt: skip
    assert "nothing needed a reload" in flashes(response)[-1]
    assert len(fake_engine.runners) == 1


def test_save_and_reload_never_cuts_an_answer_off_and_can_wait_for_it(staff, tiny_model,
                                                                      fake_engine):  # fmt: skip
    load(staff, tiny_model)
    gate, handle = busy(fake_engine, tiny_model)

    response = staff.post(reverse("model-apply", args=[tiny_model.name]), VALID)

    message = flashes(response)[-1]
    assert message.startswith(f"Settings of {tiny_model.name} saved; {tiny_model.name} is "
                              "answering a request, so it was not reloaded")  # fmt: skip
    assert "Reload when its answers end" in message
    tiny_model.refresh_from_db()
    assert tiny_model.parallel == 2  # saved all the same
    assert loaded_config(fake_engine, tiny_model).parallel == 8  # still the running engine
    page = detail(staff, tiny_model)
    assert "Loaded with earlier settings" in page and 'name="wait" value="1"' in page

    # "Reload when its answers end": the answer ends a moment later, then the reload happens.
    threading.Timer(0.5, gate.set).start()
    response = staff.post(reverse("model-reload", args=[tiny_model.name]), {"wait": "1"})

    assert handle.result(10).type == "done"  # the answer was not cut
    assert flashes(response)[-1].startswith(f"{tiny_model.name} and applied: reloaded")
    assert loaded_config(fake_engine, tiny_model).parallel == 2


def test_saving_without_reload_on_a_loaded_model_says_how_to_apply(staff, tiny_model,
                                                                  fake_engine):  # fmt: skip
    load(staff, tiny_model)
    response = staff.post(reverse("model-detail", args=[tiny_model.name]), VALID)
    assert "it is loaded with the earlier ones" in flashes(response)[-1]
    assert "Loaded with earlier settings" in detail(staff, tiny_model)


def test_members_cannot_apply_or_reload(member_client, tiny_model):
    assert member_client.post(reverse("model-apply", args=[tiny_model.name]), VALID
                              ).status_code == 403  # fmt: skip
    assert member_client.post(reverse("model-reload", args=[tiny_model.name])).status_code == 403


# 3. Errors in plain words, the detail kept.


def test_a_file_that_is_not_gguf_is_refused_in_plain_words(staff, models_dir):
    response = upload(staff, "hello.gguf", b"hello, this is a text file" * 10)

    assert response.status_code == 400
    answer = response.json()
    assert answer["error"] == (
        "hello.gguf is not a usable GGUF file: this file is not a GGUF model (it does not start"
        " with the GGUF signature)"
    )
    assert "bad magic b'hell'" in answer["detail"]  # the technical detail, kept apart


def test_a_form_upload_refusal_folds_the_detail_into_the_flash(staff, models_dir):
    response = upload(staff, "hello.gguf", b"hello" * 20, json=False)
    (message,) = flashes(response)
    assert message.startswith("Upload refused: hello.gguf is not a usable GGUF file: this file")
    assert "<details" in message and "bad magic b&#x27;hell&#x27;" in message  # escaped
    page = staff.get(response["Location"]).content.decode()  # through the message storage
    assert '<details class="detail"><summary>details</summary>' in page
    assert "<code>not a GGUF file: bad magic b&#x27;hell&#x27;" in page


# 4. Retry and dismiss.


def test_a_failed_hash_job_is_retried_as_the_same_job(
    staff, tiny_file, models_dir, django_capture_on_commit_callbacks
):
    model = register_file(tiny_file, source="scan", hash_file=False)
    job = Job.objects.create(
        kind=Job.Kind.HASH,
        model=model,
        state=Job.State.FAILED,
        message="the file could not be read\ncannot read '/x': EIO",
    )
    page = staff.get(reverse("models")).content.decode()
    assert reverse("model-job-retry", args=[job.id]) in page
    assert "<details" in page and "cannot read &#x27;/x&#x27;: EIO" in page

    with django_capture_on_commit_callbacks() as started:
        response = staff.post(reverse("model-job-retry", args=[job.id]))

    assert response.status_code == 302 and len(started) == 1
    job.refresh_from_db()
    assert job.state == Job.State.PENDING and job.message == "waiting to start again"
    assert Job.objects.count() == 1  # the same row runs again
    hash_model_job(job.id)  # what the dispatched task runs
    job.refresh_from_db()
    model.refresh_from_db()
    assert job.state == Job.State.DONE
    assert model.sha256 == hashlib.sha256(tiny_file.read_bytes()).hexdigest()


def test_only_failed_jobs_of_a_kind_that_can_run_again_are_retried(staff, tiny_model):
    running = Job.objects.create(kind=Job.Kind.HASH, model=tiny_model, state=Job.State.RUNNING)
    upload_job = Job.objects.create(kind=Job.Kind.UPLOAD, state=Job.State.FAILED)
    for job in (running, upload_job):
        response = staff.post(reverse("model-job-retry", args=[job.id]),
                              headers={"Accept": "application/json"})  # fmt: skip
        assert response.status_code == 409
    running.refresh_from_db()
    assert running.state == Job.State.RUNNING


def test_a_dismissed_job_leaves_the_list_and_a_running_one_cannot_be(staff, tiny_model):
    failed = Job.objects.create(
        kind=Job.Kind.DOWNLOAD,
        source="http://nas.local/x.gguf",
        state=Job.State.FAILED,
        message="the server answered HTTP 404",
    )
    running = Job.objects.create(kind=Job.Kind.HASH, model=tiny_model, state=Job.State.RUNNING)

    staff.post(reverse("model-job-dismiss", args=[failed.id]))
    response = staff.post(reverse("model-job-dismiss", args=[running.id]))

    assert "still running: cancel it first" in flashes(response)[-1]
    ids = [j["id"] for j in staff.get(reverse("models-status")).json()["jobs"]]
    assert ids == [running.id]
    assert "HTTP 404" not in staff.get(reverse("models")).content.decode()


def test_members_cannot_retry_or_dismiss(member_client, tiny_model):
    job = Job.objects.create(kind=Job.Kind.HASH, model=tiny_model, state=Job.State.FAILED)
    assert member_client.post(reverse("model-job-retry", args=[job.id])).status_code == 403
    assert member_client.post(reverse("model-job-dismiss", args=[job.id])).status_code == 403


# 5. One entry per file.


def test_uploading_a_file_that_is_registered_points_at_its_entry(staff, tiny_model, tiny_file):
    response = upload(staff, "again.gguf", tiny_file.read_bytes())

    assert response.status_code == 409
    assert response.json()["existing_url"] == reverse("model-detail", args=[tiny_model.name])
    assert "already registered as tiny-chat-q8_0" in response.json()["error"]
    assert LLMModel.objects.count() == 1
    assert sorted(p.name for p in tiny_file.parent.iterdir()) == [tiny_file.name]  # no copy

    form = upload(staff, "again.gguf", tiny_file.read_bytes(), json=False)
    assert form["Location"] == reverse("model-detail", args=[tiny_model.name])


def test_existing_duplicates_are_shown_so_one_can_be_deleted(staff, models_dir):
    first = register_file(tiny_gguf(models_dir / "a.gguf"), source="scan")
    second = register_file(tiny_gguf(models_dir / "b.gguf"), source="scan")
    # Two entries for one file, as a database from before one-entry-per-file may hold.
    LLMModel.objects.filter(pk=second.pk).update(sha256=first.sha256)

    assert "same file as a" in staff.get(reverse("models")).content.decode()
    page = detail(staff, second)
    assert 'id="copies"' in page and reverse("model-detail", args=["a"]) in page
