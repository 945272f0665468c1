"""One entry per file: a file is registered by its path and by its sha256, so a second import of
the same bytes (the same path, or a copy elsewhere) says so and points at the entry that holds
it, and the start-up bootstrap does not register the starter model twice."""

import shutil
from io import StringIO

import pytest
from django.core.management import call_command

from inference.catalog.importing import (
    AlreadyRegistered,
    register_file,
    register_packaged_models,
    scan_report,
)
from inference.jobs.tasks import schedule_hash
from inference.models import LLMModel
from tests.inference.ggufs import tiny_gguf

pytestmark = pytest.mark.django_db


def test_a_copy_of_a_registered_file_is_refused_naming_the_entry(models_dir, tiny_file):
    original = register_file(tiny_file, source="scan")
    copy = shutil.copy(tiny_file, models_dir / "copy.gguf")

    with pytest.raises(AlreadyRegistered) as refused:
        register_file(copy, source="scan")

    assert refused.value.model == original
    assert str(refused.value) == (
        f"this file is already registered as {original.name} (the same file: its sha256 matches)"
    )
    assert LLMModel.objects.count() == 1


def test_the_same_path_again_is_the_same_entry(models_dir, tiny_file):
    first = register_file(tiny_file, source="scan")
    assert register_file(tiny_file, source="scan") == first
    assert LLMModel.objects.count() == 1


def test_a_copy_is_found_even_before_the_entry_was_hashed(models_dir, tiny_file):
    original = register_file(tiny_file, source="scan", hash_file=False)
    copy = shutil.copy(tiny_file, models_dir / "copy.gguf")
    with pytest.raises(AlreadyRegistered):
        register_file(copy, source="scan", hash_file=False)
    original.refresh_from_db()
    assert len(original.sha256) == 64  # hashed to compare, and kept


def test_different_files_of_the_same_size_are_two_models(models_dir):
    a = register_file(tiny_gguf(models_dir / "a.gguf"), source="scan")
    b = register_file(tiny_gguf(models_dir / "b.gguf"), source="scan")  # same size, other bytes
    assert a.size_bytes == b.size_bytes and a.sha256 != b.sha256
    assert LLMModel.objects.count() == 2


def test_a_scan_skips_a_copy_with_the_reason(models_dir, tiny_file):
    register_file(tiny_file, source="scan")
    shutil.copy(tiny_file, models_dir / "copy.gguf")
    new, skipped = scan_report(schedule_hash)
    assert new == []
    ((path, reason),) = skipped
    assert path.endswith("copy.gguf") and "already registered as tiny-chat-q8_0" in reason


def test_importing_a_copy_by_hand_points_at_the_entry_and_copies_nothing(
    models_dir, tiny_file, tmp_path
):
    original = register_file(tiny_file, source="scan")
    elsewhere = shutil.copy(tiny_file, tmp_path / "Downloaded.gguf")
    out = StringIO()

    call_command("import_model", str(elsewhere), stdout=out)

    assert f"already registered as {original.name} (the same file" in out.getvalue()
    assert f"/models/{original.name}/" in out.getvalue()
    assert sorted(p.name for p in models_dir.iterdir()) == [tiny_file.name]
    assert LLMModel.objects.count() == 1


@pytest.mark.model
def test_the_bootstrap_does_not_register_the_starter_model_again_after_a_hand_import(
    models_dir, starter_path
):
    call_command("import_model", str(starter_path), stdout=StringIO())  # copied in by hand
    (imported,) = LLMModel.objects.all()

    assert register_packaged_models() == [imported]  # what every start does
    assert register_packaged_models() == [imported]
    assert list(LLMModel.objects.all()) == [imported]


@pytest.mark.model
def test_a_hand_import_after_the_bootstrap_points_at_the_starter_model(
    models_dir, starter_path, tmp_path
):
    (starter,) = register_packaged_models()
    copy = shutil.copy(starter_path, tmp_path / "smollm2.gguf")
    out = StringIO()
    call_command("import_model", str(copy), stdout=out)
    assert f"already registered as {starter.name}" in out.getvalue()
    assert list(LLMModel.objects.all()) == [starter]
