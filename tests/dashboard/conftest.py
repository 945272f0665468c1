"""Fixtures of the web side's tests."""

from pathlib import Path

import pytest

from tests.dashboard import kept_prompts

# Kept prompts behind the inference client (a fake host, a real disk tier).
kept = kept_prompts.kept


@pytest.fixture
def vision_model(starter_model, monkeypatch, tmp_path):
    """The starter paired with a tiny random projector (tests.inference.projector_gguf), so
    that it takes images. Before the catalog pairs models with projectors (issue 29 §1:
    inference.catalog.projectors), the one helper that reads the pairing says so instead."""
    try:
        from inference.catalog.projectors import register_projector, with_projector
    except ImportError:
        from dashboard.chat import turn_request

        monkeypatch.setattr(turn_request, "takes_images", lambda model: True)
        return starter_model
    from tests.inference.projector_gguf import write_projector

    path = write_projector(tmp_path / "mmproj-starter.gguf", Path(starter_model.file_path))
    return with_projector(starter_model, register_projector(path, source="scan", n_embd=None))
