"""A models directory of the test's own, tiny GGUF files in and outside it, and a LAN server."""

from dataclasses import replace
from pathlib import Path

import pytest

from inference.catalog import netguard
from tests.inference.ggufs import corrupt_copy, tiny_gguf
from tests.inference.http_server import ModelServer


@pytest.fixture
def models_dir(settings, tmp_path) -> Path:
    directory = tmp_path / "models"
    directory.mkdir()
    settings.MODELS_DIR = directory
    return directory


@pytest.fixture
def tiny_file(models_dir) -> Path:
    """A valid tiny model inside the models directory."""
    return tiny_gguf(models_dir / "Tiny-Chat.Q8_0.gguf")


@pytest.fixture
def outside_file(tmp_path) -> Path:
    """A valid tiny model outside the models directory."""
    return tiny_gguf(tmp_path / "elsewhere" / "outside.gguf")


@pytest.fixture
def corrupt_file(tmp_path, outside_file) -> Path:
    return corrupt_copy(outside_file, tmp_path / "elsewhere" / "broken.gguf")


@pytest.fixture
def model_server(outside_file, monkeypatch):
    """The LAN server, on loopback, which the download guard refuses: downloads (through the
    view and the task too) get the settings' policy with this one server trusted."""
    server = ModelServer({"tiny.gguf": outside_file.read_bytes(), "page.html": b"<html>" * 100})
    server.start()
    of_settings = netguard.settings_policy
    trusted = frozenset({server.endpoint})
    monkeypatch.setattr(
        netguard, "settings_policy", lambda: replace(of_settings(), trusted=trusted)
    )
    yield server
    server.stop()
