"""Tiny GGUF files and a registry on loopback that the settings name (so the pull policy trusts
it, as it trusts a configured registry); the models directory is tests/inference/conftest.py's."""


import pytest

from tests.inference.catalog.pulling.registry import FakeRegistry
from tests.inference.ggufs import tiny_gguf


@pytest.fixture
def registry(settings):
    server = FakeRegistry().start()
    settings.MODEL_REGISTRY_URL = server.base
    settings.HF_ENDPOINT = server.base
    yield server
    server.stop()


@pytest.fixture
def gguf(tmp_path) -> bytes:
    return tiny_gguf(tmp_path / "served" / "tiny.gguf").read_bytes()


@pytest.fixture
def other_gguf(tmp_path) -> bytes:
    return tiny_gguf(tmp_path / "served" / "other.gguf").read_bytes()
