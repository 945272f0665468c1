"""Registering GGUF files: every field from the header, the hash, idempotent scans, packaged
models, and unregistering."""

import hashlib
import logging
import shutil

import pytest

from inference.catalog.importing import (
    ImportRefused,
    hash_model_job,
    register_file,
    register_packaged_models,
    scan_models_dir,
    scan_report,
)
from inference.catalog.operations import unregister
from inference.gguf import GGUFError, read_gguf
from inference.jobs.tasks import schedule_hash
from inference.models import Job, LLMModel
from tests.inference.ggufs import TEMPLATE, corrupt_copy, tiny_gguf

pytestmark = pytest.mark.django_db


def test_register_file_fills_every_field_and_the_hash(tiny_file):
    model = register_file(tiny_file, source=LLMModel.Source.SCAN)
    info = read_gguf(tiny_file)

    model.refresh_from_db()
    assert model.name == "tiny-chat-q8_0"
    assert model.file_path == str(tiny_file.resolve())
    assert model.size_bytes == tiny_file.stat().st_size
    assert model.sha256 == hashlib.sha256(tiny_file.read_bytes()).hexdigest()
    assert model.source == "scan"
    assert model.architecture == "llama"
    assert model.parameter_count == info.parameter_count > 0
    assert model.quantization == info.quantization
    assert model.context_length == 256
    assert model.layer_count == 2
    assert model.embedding_length == 64
    assert model.head_count == 4
    assert model.head_count_kv == 2
    assert model.chat_template == TEMPLATE
    assert model.tokenizer == "gpt2"
    assert model.license == "mit"
    assert model.metadata["bos_token"] == "<|im_start|>"
    assert model.metadata["eos_token"] == "<|im_end|>"
    assert model.metadata["vocab_size"] == 16
    assert model.n_ctx == 0  # automatic: sized at each load (inference.planning.preflight)
    assert model.estimated_bytes > info.weights_bytes
    assert model.is_default  # the first model
    assert model.hidden is False


def test_the_metadata_keeps_the_special_tokens_but_never_the_vocabulary(starter_path, models_dir):
    model = register_file(starter_path, source=LLMModel.Source.PACKAGE, hash_file=False)
    keys = model.metadata["keys"]
    assert model.metadata["bos_token"] == "<|im_start|>"
    assert model.metadata["eos_token"] == "<|im_end|>"
    assert keys["tokenizer.ggml.tokens"] == {"array": "string", "length": 49152}
    assert keys["tokenizer.ggml.merges"]["length"] == 48900
    assert "tokenizer.chat_template" not in keys  # in its own field
    assert keys["llama.block_count"] == 30
    assert len(str(model.metadata)) < 20_000


def test_a_small_vocabulary_is_still_summarised(models_dir):
    path = tiny_gguf(models_dir / "vocab.gguf", n_vocab=300)
    model = register_file(path, source=LLMModel.Source.SCAN, hash_file=False)
    assert model.metadata["keys"]["tokenizer.ggml.tokens"] == {"array": "list", "length": 300}


def test_a_corrupt_file_is_refused_and_nothing_is_registered(corrupt_file):
    with pytest.raises(GGUFError, match="past the end|beyond|truncated|file"):
        register_file(corrupt_file, source=LLMModel.Source.SCAN)
    assert LLMModel.all_objects.count() == 0


def test_registering_the_same_file_again_returns_the_same_record(tiny_file):
    first = register_file(tiny_file, source=LLMModel.Source.SCAN)
    again = register_file(tiny_file, source=LLMModel.Source.UPLOAD)
    assert again.pk == first.pk
    assert LLMModel.objects.count() == 1


def test_only_the_first_model_becomes_the_default(models_dir):
    first = register_file(tiny_gguf(models_dir / "a.gguf"), source="scan", hash_file=False)
    second = register_file(tiny_gguf(models_dir / "b.gguf"), source="scan", hash_file=False)
    assert first.is_default and not second.is_default


def test_names_come_from_the_file_and_never_collide(models_dir):
    (models_dir / "x").mkdir()
    one = register_file(tiny_gguf(models_dir / "Same.gguf"), source="scan", hash_file=False)
    two = register_file(tiny_gguf(models_dir / "x" / "same.gguf"), source="scan", hash_file=False)
    reserved = register_file(tiny_gguf(models_dir / "scan.gguf"), source="scan", hash_file=False)
    assert (one.name, two.name) == ("same", "same-2")
    assert reserved.name == "scan-2"  # /models/scan/ is the scan button


def test_a_chosen_name_must_be_a_free_slug(models_dir, tiny_file):
    register_file(tiny_file, source="scan", name="mine", hash_file=False)
    other = tiny_gguf(models_dir / "other.gguf")
    with pytest.raises(ImportRefused, match="already registered"):
        register_file(other, source="scan", name="mine")
    with pytest.raises(ImportRefused, match="letters, digits"):
        register_file(other, source="scan", name="no spaces/please")
    with pytest.raises(ImportRefused, match="reserved"):
        register_file(other, source="scan", name="upload")


def test_a_scan_is_idempotent_and_skips_a_corrupt_file_with_a_logged_reason(
    models_dir, tiny_file, outside_file, caplog
):
    corrupt_copy(outside_file, models_dir / "sub" / "broken.gguf")
    (models_dir / "notes.txt").write_text("not a model")

    with caplog.at_level(logging.WARNING, logger="inference.catalog.importing"):
        first = scan_models_dir(schedule_hash)
    assert [m.name for m in first] == ["tiny-chat-q8_0"]
    assert any("broken.gguf" in r.getMessage() and "skipping" in r.getMessage()
               for r in caplog.records)  # fmt: skip

    assert scan_models_dir(schedule_hash) == []
    assert LLMModel.objects.count() == 1
    _, skipped = scan_report(schedule_hash)
    assert [path.endswith("broken.gguf") for path, _ in skipped] == [True]


def test_a_scan_ignores_partial_files_of_uploads_and_downloads(models_dir, outside_file):
    shutil.copy(outside_file, models_dir / ".download-7.part")
    (models_dir / ".incoming").mkdir()
    shutil.copy(outside_file, models_dir / ".incoming" / "half.gguf")
    assert scan_models_dir(schedule_hash) == []


def test_a_scan_hashes_new_models_in_a_job_with_progress(models_dir, tiny_file):
    (model,) = scan_models_dir(schedule_hash)
    assert model.sha256 == ""
    job = Job.objects.get(model=model, kind=Job.Kind.HASH)
    assert job.state == Job.State.PENDING

    digest = hash_model_job(job.id)

    job.refresh_from_db()
    model.refresh_from_db()
    assert digest == model.sha256 == hashlib.sha256(tiny_file.read_bytes()).hexdigest()
    assert job.state == Job.State.DONE and job.progress == 1.0
    assert hash_model_job(job.id) is None  # a finished job is left alone


def test_a_cancelled_hash_job_does_not_run(models_dir, tiny_file):
    (model,) = scan_models_dir(schedule_hash)
    job = Job.objects.get(model=model)
    Job.objects.filter(pk=job.pk).update(state=Job.State.CANCELLED)
    assert hash_model_job(job.id) is None
    model.refresh_from_db()
    assert model.sha256 == ""


def test_packaged_models_register_once_and_a_deleted_one_stays_hidden(starter_path, models_dir):
    (model,) = register_packaged_models()
    assert model.name == "smollm2-135m-instruct"
    assert model.source == LLMModel.Source.PACKAGE
    assert len(model.sha256) == 64
    assert [m.pk for m in register_packaged_models()] == [model.pk]

    outcome = unregister(model)

    assert "belongs to a package" in outcome
    assert starter_path.is_file()  # never delete a package's file
    assert register_packaged_models() == []
    assert not LLMModel.objects.filter(name=model.name).exists()
    assert LLMModel.all_objects.get(pk=model.pk).hidden


def test_unregister_deletes_the_file_only_inside_the_models_directory(tiny_file, outside_file):
    inside = register_file(tiny_file, source="scan", hash_file=False)
    outside = register_file(outside_file, source="upload", hash_file=False)
    assert inside.is_default

    unregister(inside)
    unregister(outside)

    assert not tiny_file.exists()
    assert outside_file.exists()
    assert LLMModel.all_objects.count() == 0


def test_deleting_the_default_model_passes_the_default_on(models_dir):
    first = register_file(tiny_gguf(models_dir / "a.gguf"), source="scan", hash_file=False)
    second = register_file(tiny_gguf(models_dir / "b.gguf"), source="scan", hash_file=False)
    unregister(first)
    second.refresh_from_db()
    assert second.is_default


def test_bootstrap_registers_packaged_and_scanned_models_once(models_dir, tiny_file, starter_path):
    from io import StringIO

    from django.core.management import call_command

    first, second = StringIO(), StringIO()
    call_command("bootstrap", stdout=first)
    call_command("bootstrap", stdout=second)

    assert "starter model: smollm2-135m-instruct" in first.getvalue()
    assert "found model: tiny-chat-q8_0" in first.getvalue()
    assert "found model" not in second.getvalue()
    assert sorted(LLMModel.objects.values_list("name", flat=True)) == [
        "smollm2-135m-instruct", "tiny-chat-q8_0",
    ]  # fmt: skip
    assert LLMModel.objects.get(is_default=True).name == "smollm2-135m-instruct"


def test_a_model_left_unhashed_by_a_dead_job_gets_a_new_one(models_dir, tiny_file):
    from datetime import timedelta

    from django.utils import timezone

    (model,) = scan_models_dir(schedule_hash)
    scan_models_dir(schedule_hash)
    assert Job.objects.filter(model=model).count() == 1  # the first job is still active
    Job.objects.update(state=Job.State.RUNNING, updated_at=timezone.now() - timedelta(hours=1))

    scan_models_dir(schedule_hash)

    assert Job.objects.filter(model=model, state=Job.State.PENDING).count() == 1


def test_partial_files_nobody_will_finish_are_removed(models_dir):
    import os
    import time

    from inference.catalog.importing import clean_partial_files

    running = Job.objects.create(kind=Job.Kind.DOWNLOAD, state=Job.State.RUNNING)
    failed = Job.objects.create(kind=Job.Kind.DOWNLOAD, state=Job.State.FAILED)
    for name in (f".download-{running.id}.part", f".download-{failed.id}.part",
                 ".upload-fresh.part", ".upload-old.part", "kept.gguf"):  # fmt: skip
        (models_dir / name).write_bytes(b"GGUF")
    hours_ago = time.time() - 7 * 3600
    os.utime(models_dir / ".upload-old.part", (hours_ago, hours_ago))

    assert sorted(clean_partial_files()) == [f".download-{failed.id}.part", ".upload-old.part"]
    assert sorted(p.name for p in models_dir.iterdir()) == sorted(
        [f".download-{running.id}.part", ".upload-fresh.part", "kept.gguf"]
    )
