"""Fixtures of the web side's tests."""

from pathlib import Path

import pytest

from tests.dashboard import kept_prompts

# Kept prompts behind the inference client (a fake host, a real disk tier).
kept = kept_prompts.kept


@pytest.fixture
def vision_model(starter_model, tmp_path):
    """The starter paired with a tiny random projector (tests.inference.projector_gguf), so
    that it takes images."""
    from inference.catalog.projectors import register_projector, with_projector
    from tests.inference.projector_gguf import write_projector

    path = write_projector(tmp_path / "mmproj-starter.gguf", Path(starter_model.file_path))
    return with_projector(starter_model, register_projector(path, source="scan", n_embd=None))
