"""The registry table, the live status, and a model's page: what the file says (escaped), the
estimate against free memory, the hash in progress."""

import pytest
from django.urls import reverse

from dashboard.model_pages import readings
from inference.catalog.importing import register_file, scan_models_dir
from inference.jobs.tasks import schedule_hash
from inference.models import Job
from tests.inference.ggufs import corrupt_copy, tiny_gguf

pytestmark = pytest.mark.django_db


def test_the_registry_table_lists_what_each_file_says(staff, tiny_model):
    page = staff.get(reverse("models")).content.decode()
    row = page[page.index(f'data-model="{tiny_model.name}"') :]
    row = row[: row.index("</tr>")]
    for text in ("llama", tiny_model.quantization, ">256<", "default", "KiB"):
        assert text in row, text
    assert "Scan models directory" in page and 'id="upload-form"' in page


def test_members_see_the_table_without_the_forms(member_client, tiny_model):
    page = member_client.get(reverse("models")).content.decode()
    assert tiny_model.name in page
    assert "Scan models directory" not in page and "upload-form" not in page


def test_the_scan_button_registers_new_files_and_names_the_skipped_ones(
    staff, models_dir, outside_file
):
    tiny_gguf(models_dir / "fresh.gguf")
    corrupt_copy(outside_file, models_dir / "broken.gguf")

    response = staff.post(reverse("models-scan"), follow=True)

    page = response.content.decode()
    assert "Registered 1 new model(s): fresh" in page
    assert "Skipped broken.gguf" in page
    assert Job.objects.filter(kind=Job.Kind.HASH, model__name="fresh").exists()


def test_loaded_models_show_like_ollama_ps(staff, tiny_model, fake_engine):
    staff.post(reverse("model-load", args=[tiny_model.name]))

    status = staff.get(reverse("models-status")).json()
    (row,) = status["loaded"]
    assert row["name"] == tiny_model.name and row["busy"] is False
    assert row["expires_in"] > 0 and row["worker"] == "embedded"
    assert status["loading"] == []
    assert status["memory"]["ram_total"] > 0
    page = staff.get(reverse("models")).content.decode()
    assert 'class="badge on">loaded<' in page


def test_a_load_under_way_is_reported(staff, fake_engine):
    fake_engine.host.loading = "big-model"
    try:
        assert staff.get(reverse("models-status")).json()["loading"] == ["big-model"]
        assert (
            'Loading <b id="loading-names">big-model</b>'
            in staff.get(reverse("models")).content.decode()
        )
    finally:
        fake_engine.host.loading = None


def test_a_models_page_shows_everything_the_gguf_says(staff, tiny_model):
    page = staff.get(reverse("model-detail", args=[tiny_model.name])).content.decode()
    for text in ("Architecture", "llama", "Context length", "256", "Layers", "Embedding size",
                 "64", "KV heads 2", "gpt2", "mit", tiny_model.sha256, "&lt;|im_start|&gt;",
                 "tokenizer.ggml.tokens"):  # fmt: skip
        assert text in page, text


def test_the_chat_template_is_shown_escaped(staff, models_dir):
    hostile = "{{ '<script>alert(1)</script>' }}{% for m in messages %}{{ m.content }}{% endfor %}"
    model = register_file(tiny_gguf(models_dir / "t.gguf", chat_template=hostile), source="scan")
    page = staff.get(reverse("model-detail", args=[model.name])).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script>alert(1)" not in page


def test_the_estimate_is_shown_against_free_memory(staff, tiny_model, settings):
    settings.PROMPT_CACHE_RAM = 0  # warm memory off: finished turns keep slots of their own
    page = staff.get(reverse("model-detail", args=[tiny_model.name])).content.decode()
    assert "Estimate for these settings" in page
    # 256 per sequence x 16 slots: 8 running sequences and 8 that keep finished turns cached
    assert (
        "256 tokens per sequence × 16 sequences (8 answering at once + 8 kept for cached "
        "conversations) = 4096 tokens, f16"
    ) in page
    assert "Fits in the memory free now" in page


def test_a_model_that_would_not_fit_says_so_with_the_numbers(staff, tiny_model, monkeypatch):
    real = readings.memory

    def tiny(snaps):
        found = real(snaps)
        return readings.Memory(1 << 20, found.ram_total, None, None, found.worker_bytes, [])

    monkeypatch.setattr(readings, "memory", tiny)
    page = staff.get(reverse("model-detail", args=[tiny_model.name])).content.decode()
    assert "Would not load now: needs" in page and "1 MiB of RAM is free" in page


def test_the_hash_shows_progress_until_the_job_is_done(staff, models_dir, tiny_file):
    (model,) = scan_models_dir(schedule_hash)
    job = Job.objects.get(model=model)
    page = staff.get(reverse("model-detail", args=[model.name])).content.decode()
    assert "hashing…" in page and reverse("model-job", args=[job.id]) in page

    from inference.catalog.importing import hash_model_job

    hash_model_job(job.id)
    answer = staff.get(reverse("model-job", args=[job.id])).json()
    assert answer["state"] == "done" and answer["progress"] == 1.0
    assert (
        answer["sha256"]
        and answer["sha256"]
        in staff.get(reverse("model-detail", args=[model.name])).content.decode()
    )


def test_an_unknown_model_is_404(staff):
    assert staff.get(reverse("model-detail", args=["nope"])).status_code == 404
    assert staff.post(reverse("model-load", args=["nope"])).status_code == 404


def test_the_pages_allow_scripts_only_from_the_appliance(staff, tiny_model):
    for url in (reverse("models"), reverse("model-detail", args=[tiny_model.name]),
                reverse("model-delete", args=[tiny_model.name])):  # fmt: skip
        assert "script-src 'self'" in staff.get(url)["Content-Security-Policy"], url


def test_on_a_box_with_a_gpu_the_estimate_is_split_and_nvml_is_shown(staff, tiny_model,
                                                                     monkeypatch):  # fmt: skip
    gib = 1 << 30
    snapshot = {
        "worker": "gpu-box", "loading": None, "loaded": [],
        "system": {
            "gpus": [{"index": 0, "name": "NVIDIA H200", "used_bytes": 2 * gib,
                      "total_bytes": 140 * gib, "process_bytes": gib, "utilization": 0}],
            "rss_bytes": gib, "ram_total_bytes": 64 * gib, "ram_available_bytes": 60 * gib,
        },
    }  # fmt: skip
    monkeypatch.setattr(readings, "snapshots", lambda: [snapshot])

    page = staff.get(reverse("model-detail", args=[tiny_model.name])).content.decode()

    assert "On the GPU (2 of 2 layers) / in RAM" in page
    assert "GPU 0 NVIDIA H200: 2.0 GiB used of 140.0 GiB, the worker's own 1.0 GiB" in page
    assert "GPU 138.0 GiB of 140.0 GiB" in page and "the inference worker holds 2.0 GiB" in page
    assert "Fits in the memory free now" in page


SEGV = "killed by signal 11 (SIGSEGV) during decode"
SELF_CHECK = (
    "CPU self-check: the runner killed by signal 11 (SIGSEGV) during load with llama.cpp's "
    "extra buffer types (AMX, repacking), so models on this host load without them"
)


def runner_snapshot(*runners: dict, worker: str = "embedded") -> dict:
    """A worker's snapshot with these RunnerStates (inference.serving.supervisor), 1000 s in."""
    rows = [{"pid": None, "restarts": 0, "crashes_in_a_row": 0, "last_exit": None,
             "last_exit_at": None, "retry_in": None, "extra_bufts": True, "note": "", **r}
            for r in runners]  # fmt: skip
    return {"worker": worker, "time": 1000.0, "loading": None, "loaded": [], "runners": rows,
            "system": {"gpus": [], "rss_bytes": 1 << 30, "ram_total_bytes": 64 << 30,
                       "ram_available_bytes": 60 << 30}}  # fmt: skip


def test_a_models_page_says_its_runner_is_backing_off_and_why(staff, tiny_model, monkeypatch):
    snapshot = runner_snapshot(
        {"model": tiny_model.name, "state": "backing off", "restarts": 2, "crashes_in_a_row": 3,
         "last_exit": SEGV, "last_exit_at": 880.0, "retry_in": 12.4, "extra_bufts": False,
         "note": SELF_CHECK},
        {"model": "another-model", "state": "running", "pid": 99, "last_exit": "not this one"},
    )  # fmt: skip
    monkeypatch.setattr(readings, "snapshots", lambda: [snapshot])

    page = staff.get(reverse("model-detail", args=[tiny_model.name])).content.decode()

    assert "backing off: it crashed 3 times in a row, so requests for this model are" in page
    assert '<td class="refusal">backing off' in page
    assert "<th>Restarts</th><td>2</td>" in page
    assert f"{SEGV}, 2m 0s ago" in page  # on the worker's clock: the snapshot's time minus the exit
    assert "the next start is allowed in 12s" in page
    assert "CPU self-check: the runner killed by signal 11 (SIGSEGV) during load" in page
    assert "llama.cpp&#x27;s extra buffer types" in page  # escaped like everything it shows
    assert "not this one" not in page and "No runner process yet" not in page

    (row,) = staff.get(reverse("models-status")).json()["runners"][tiny_model.name]
    assert (row["state"], row["usable"], row["restarts"]) == ("backing off", False, 2)
    assert (row["wait"], row["note"]) == ("the next start is allowed in 12s", SELF_CHECK)


def test_a_running_runner_shows_its_pid_and_no_back_off(staff, tiny_model, monkeypatch):
    snapshot = runner_snapshot({"model": tiny_model.name, "state": "running", "pid": 4242,
                                "restarts": 1, "last_exit": SEGV,
                                "last_exit_at": 995.0})  # fmt: skip
    monkeypatch.setattr(readings, "snapshots", lambda: [snapshot])

    page = staff.get(reverse("model-detail", args=[tiny_model.name])).content.decode()

    assert "<td>running (pid 4242)</td>" in page
    assert "<th>Restarts</th><td>1</td>" in page and f"{SEGV}, 5s ago" in page
    assert "Back-off" not in page and "CPU self-check" not in page


@pytest.mark.parametrize(("state", "words"), [
    ("crashed", "crashed: the next request starts it again"),
    ("failed", "failed: its last start did not load the model"),
    ("stopped", "stopped: the model was unloaded"),
])  # fmt: skip
def test_each_runner_state_is_said_in_plain_words(staff, tiny_model, monkeypatch, state, words):
    snapshot = runner_snapshot({"model": tiny_model.name, "state": state})
    monkeypatch.setattr(readings, "snapshots", lambda: [snapshot])
    page = staff.get(reverse("model-detail", args=[tiny_model.name])).content.decode()
    assert words in page
    assert ('class="refusal">' + words in page) == (state == "failed")  # only failed refuses


def test_a_model_that_never_ran_says_so(staff, tiny_model):
    page = staff.get(reverse("model-detail", args=[tiny_model.name])).content.decode()
    assert "No runner process yet: one starts when the model loads." in page
    assert tiny_model.name not in staff.get(reverse("models-status")).json()["runners"]


def test_with_several_workers_each_runner_names_its_worker(staff, tiny_model, monkeypatch):
    snaps = [runner_snapshot({"model": tiny_model.name, "state": "running", "pid": 1},
                             worker="box-a"),
             runner_snapshot({"model": tiny_model.name, "state": "crashed", "last_exit": SEGV},
                             worker="box-b")]  # fmt: skip
    monkeypatch.setattr(readings, "snapshots", lambda: snaps)
    page = staff.get(reverse("model-detail", args=[tiny_model.name])).content.decode()
    assert "<th>State on box-a</th><td>running (pid 1)</td>" in page
    assert "<th>State on box-b</th><td>crashed" in page
    assert f"{SEGV}</td>" in page  # no time: the exit's moment was not reported
