"""`manage.py import_model`: copies in or registers in place, and fails clearly."""

import hashlib
import os
import subprocess
import sys
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from inference.models import LLMModel

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]


def run(*args) -> str:
    out = StringIO()
    call_command("import_model", *args, stdout=out)
    return out.getvalue()


def test_a_file_outside_the_models_directory_is_copied_in_and_registered(models_dir, outside_file):
    output = run(str(outside_file), "--name", "imported")

    model = LLMModel.objects.get(name="imported")
    copy = models_dir / "outside.gguf"
    assert model.file_path == str(copy)
    assert copy.read_bytes() == outside_file.read_bytes()
    assert outside_file.exists()  # copied, not moved
    assert model.sha256 == hashlib.sha256(outside_file.read_bytes()).hexdigest()
    assert model.source == LLMModel.Source.IMPORT
    assert "copying: 100%" in output and "registered imported" in output
    assert [p.name for p in models_dir.iterdir()] == ["outside.gguf"]  # no partial file left


def test_a_file_inside_the_models_directory_is_registered_in_place(models_dir, tiny_file):
    output = run(str(tiny_file))
    model = LLMModel.objects.get()
    assert model.file_path == str(tiny_file)
    assert len(model.sha256) == 64
    assert "hashing: 100%" in output
    assert "already registered as" in run(str(tiny_file))


def test_a_missing_file_is_refused(models_dir, tmp_path):
    with pytest.raises(CommandError, match="no such file"):
        run(str(tmp_path / "nope.gguf"))


def test_a_corrupt_file_is_refused_and_nothing_is_left_behind(models_dir, corrupt_file):
    with pytest.raises(CommandError, match="is not a usable GGUF file"):
        run(str(corrupt_file))
    assert LLMModel.all_objects.count() == 0
    assert list(models_dir.iterdir()) == []


def test_a_taken_name_is_refused_before_copying(models_dir, tiny_file, outside_file):
    run(str(tiny_file), "--name", "taken")
    with pytest.raises(CommandError, match="already registered"):
        run(str(outside_file), "--name", "taken")
    assert [p.name for p in models_dir.iterdir()] == [tiny_file.name]


def test_the_command_exits_non_zero_with_the_reason_on_stderr(tmp_path, corrupt_file):
    env = dict(os.environ, DJANGO_SETTINGS_MODULE="tests.settings",
               APPLIANCE_DATA_DIR=str(tmp_path / "data"))  # fmt: skip
    env.pop("MODELS_DIR", None)
    done = subprocess.run(
        [sys.executable, "manage.py", "import_model", str(corrupt_file)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0
    assert "is not a usable GGUF file" in done.stderr
