"""A live appliance for the LAN API tests, started once per session in a subprocess.

The API runs as it does on a box: uvicorn (`manage.py serve`), embedded mode, the real starter
model through llama.cpp, keys created by the management command. A second server on the same
data dir runs with a tiny rate limit and engine queue for the 429 tests.
"""

import httpx
import pytest

from tests.dashboard.api.server import Appliance, prepare

RATE_LIMIT = 3


@pytest.fixture(scope="session")
def appliance(tmp_path_factory, starter_path) -> Appliance:
    running = prepare(tmp_path_factory.mktemp("api-appliance"))
    running.start()
    yield running
    running.stop()


@pytest.fixture(scope="session")
def limited_appliance(appliance) -> Appliance:
    """The same data (keys, model) served with API_RATE_LIMIT_PER_MINUTE=3 and a queue of 1."""
    limited = Appliance(appliance.data_dir, dict(appliance.env), dict(appliance.keys))
    limited.start(API_RATE_LIMIT_PER_MINUTE=str(RATE_LIMIT), ENGINE_MAX_QUEUE="1")
    yield limited
    limited.stop()


@pytest.fixture
def http(appliance) -> httpx.Client:
    with httpx.Client(base_url=appliance.url, timeout=120) as client:
        yield client


@pytest.fixture
def chat_headers(appliance) -> dict:
    return appliance.headers("chat-app")


@pytest.fixture
def manage_headers(appliance) -> dict:
    return appliance.headers("manage-app")


@pytest.fixture
def admin_headers(appliance) -> dict:
    return appliance.headers("admin-app")
