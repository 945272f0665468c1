"""Split mode for real: Redis on 127.0.0.1:6379 (database 15, flushed once per session), real
inference worker processes, and a SplitClient in the test process; a plugin of the whole suite
(tests/conftest.py), used by the split-mode tests wherever they are.

Skipped only when that Redis does not answer (CI starts one)."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pytest
import redis

from inference.engine.host import ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.serving import split_protocol as protocol
from tests.split.workers import REDIS_URL, WorkerProcess, clean_split_redis

if TYPE_CHECKING:
    from inference.serving.split_client import SplitClient


@pytest.fixture(scope="session")
def split_redis():
    client = clean_split_redis()
    yield client
    client.close()


@contextmanager
def split_web_process(settings, redis_url: str) -> Iterator[None]:
    """This process's settings as those of a split-mode web process on the Redis at
    `redis_url` (`settings`: pytest-django's fixture, which puts them back)."""
    from appliance.celery import app

    settings.REDIS_URL = redis_url
    settings.SPLIT_MODE = True
    settings.CELERY_BROKER_URL = redis_url
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [redis_url], "capacity": 2000, "expiry": 30},
        }
    }
    previous = app.conf.broker_url
    app.conf.broker_url = redis_url  # the Celery app read the settings at import
    try:
        yield
    finally:
        app.conf.broker_url = previous


@contextmanager
def split_client_on(redis_url: str, **options) -> Iterator["SplitClient"]:
    """A SplitClient as get_client() returns it in a split-mode web process."""
    from inference.serving import client as client_module
    from inference.serving.split_client import SplitClient

    # The session's embedded client (and the model it holds) comes back afterwards; asking
    # get_client() for it here would build a SplitClient, since the settings say split mode.
    shared = client_module._client
    client = SplitClient(redis_url, **options)
    client_module.set_client(client)
    try:
        yield client
    finally:
        client_module.set_client(shared)


@pytest.fixture
def split_mode(settings, split_redis):
    """This process's settings as a split-mode web process's."""
    with split_web_process(settings, REDIS_URL):
        yield split_redis


@pytest.fixture
def split_client(split_mode):
    with split_client_on(REDIS_URL) as client:
        yield client


@pytest.fixture(scope="session")
def spec(starter_path) -> ModelSpec:
    """The starter model with settings small enough for a shared 2-core box."""
    config = RunnerConfig(
        model_path=str(starter_path), ctx_per_seq=1024, parallel=4, cache_slots=2, n_threads=2
    )
    return ModelSpec("smollm2-135m-instruct", config, keep_alive=-1)


@pytest.fixture
def start_worker(tmp_path, split_redis):
    """Start real workers (stopped at the end of the test); returns the WorkerProcess."""
    started: list[WorkerProcess] = []

    def start(*, wait: bool = True, env: dict | None = None) -> WorkerProcess:
        worker = WorkerProcess(tmp_path, env=env).start()
        started.append(worker)
        if wait:
            worker.wait_until_alive()
        return worker

    yield start
    for worker in started:
        worker.stop()


@pytest.fixture(scope="module")
def shared_worker(tmp_path_factory, split_redis):
    """One worker for a whole module of tests that do not kill it."""
    no_workers_left(split_redis)
    worker = WorkerProcess(tmp_path_factory.mktemp("workers")).start()
    worker.wait_until_alive()
    yield worker
    worker.stop()


def no_workers_left(client: redis.Redis, timeout: float = 30.0) -> None:
    """Wait for heartbeats of workers of earlier tests to expire."""
    deadline = time.monotonic() + timeout
    while list(client.scan_iter(match=protocol.ALIVE_PATTERN)):
        if time.monotonic() > deadline:
            raise RuntimeError("workers of earlier tests are still alive")
        time.sleep(0.2)
