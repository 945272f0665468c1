"""/healthz: no login, JSON, 200 when usable and 503 when a part is down."""

import pytest

pytestmark = pytest.mark.django_db


def test_it_reports_an_embedded_appliance_as_usable_without_a_login(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body == {
        "web": "ok", "worker": "ok", "broker": "not used", "models": body["models"],
        "mode": "embedded",
    }  # fmt: skip
    assert isinstance(body["models"], list)
    assert response["Cache-Control"].startswith("max-age=0")


@pytest.mark.model
def test_it_lists_the_loaded_models(client, starter_model):
    from asgiref.sync import async_to_sync

    from inference.client import get_client
    from inference.registry import spec_for

    async_to_sync(get_client().load)(spec_for(starter_model))
    assert starter_model.name in client.get("/healthz").json()["models"]


def test_it_answers_503_when_the_broker_is_down(client, settings):
    settings.SPLIT_MODE = True
    settings.REDIS_URL = "redis://127.0.0.1:1/15"  # nothing listens on port 1
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert (body["broker"], body["worker"], body["mode"]) == ("down", "down", "split")


def test_it_only_answers_get(client):
    assert client.post("/healthz").status_code == 405


@pytest.fixture
def swap_client():
    """Put another inference client in place for one test, then the shared one back."""
    from inference import client as client_module

    shared = client_module.get_client()
    yield client_module.set_client
    client_module.set_client(shared)


@pytest.mark.redis
def test_it_answers_503_in_split_mode_when_no_inference_worker_reports(
    client, settings, swap_client
):
    from inference.split_client import SplitClient

    settings.SPLIT_MODE = True
    settings.REDIS_URL = "redis://127.0.0.1:6379/13"
    swap_client(SplitClient(settings.REDIS_URL))
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert (body["broker"], body["worker"], body["models"]) == ("ok", "down", [])


def test_a_worker_whose_last_snapshot_is_stale_counts_as_down(client, swap_client):
    import time

    class Silent:
        """A worker that reported once, long ago."""

        def snapshots(self):
            return [{"worker": "w", "time": time.time() - 3600, "loaded": [{"name": "m"}]}]

    swap_client(Silent())
    response = client.get("/healthz")
    assert response.status_code == 503
    assert (response.json()["worker"], response.json()["models"]) == ("down", [])
