"""/healthz: no login, JSON, 200 when usable and 503 when a part is down."""

import pytest

pytestmark = pytest.mark.django_db


def test_it_reports_an_embedded_appliance_as_usable_without_a_login(client):
    response = client.get("/healthz")
    assert response.status_code == 200
    body = response.json()
    assert body == {
        "web": "ok", "worker": "ok", "broker": "not used", "models": body["models"],
        "unusable_models": body["unusable_models"], "workers": body["workers"],
        "mode": "embedded",
    }  # fmt: skip
    assert isinstance(body["models"], list)
    assert [w["worker"] for w in body["workers"]] == ["embedded"]
    assert response["Cache-Control"].startswith("max-age=0")


@pytest.mark.model
def test_it_lists_the_loaded_models(client, starter_model):
    from asgiref.sync import async_to_sync

    from inference.catalog.specs import spec_for
    from inference.serving.client import get_client

    async_to_sync(get_client().load)(spec_for(starter_model))
    assert starter_model.name in client.get("/healthz").json()["models"]


def test_it_answers_503_when_the_broker_is_down(client, settings, swap_client):
    from inference.serving.split_client import SplitClient

    settings.SPLIT_MODE = True
    settings.REDIS_URL = "redis://127.0.0.1:1/15"  # nothing listens on port 1
    swap_client(SplitClient(settings.REDIS_URL))
    response = client.get("/healthz")
    assert response.status_code == 503
    body = response.json()
    assert (body["broker"], body["worker"], body["mode"]) == ("down", "down", "split")


def test_it_only_answers_get(client):
    assert client.post("/healthz").status_code == 405


@pytest.fixture
def swap_client():
    """Put another inference client in place for one test, then the shared one back."""
    from inference.serving import client as client_module

    shared = client_module.get_client()
    yield client_module.set_client
    client_module.set_client(shared)


@pytest.mark.redis
def test_it_answers_503_in_split_mode_when_no_inference_worker_reports(
    client, settings, swap_client
):
    from inference.serving.split_client import SplitClient

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

        mode = "embedded"

        def snapshots(self):
            return [{"worker": "w", "time": time.time() - 3600, "loaded": [{"name": "m"}]}]

    swap_client(Silent())
    response = client.get("/healthz")
    assert response.status_code == 503
    assert (response.json()["worker"], response.json()["models"]) == ("down", [])
    assert response.json()["workers"] == [] and response.json()["unusable_models"] == []


def runner(model, state, **fields):
    """A RunnerState (inference.serving.supervisor) as a worker's snapshot carries it."""
    return {"model": model, "state": state, "pid": None, "restarts": 0, "crashes_in_a_row": 0,
            "last_exit": None, "last_exit_at": None, "retry_in": None, "extra_bufts": True,
            "note": "", **fields}  # fmt: skip


class Reporting:
    """Workers that reported just now, with these runners each."""

    mode = "embedded"

    def __init__(self, **runners_per_worker):
        self.runners_per_worker = runners_per_worker

    def snapshots(self):
        import time

        return [{"worker": worker, "time": time.time(), "loaded": [], "runners": runners}
                for worker, runners in self.runners_per_worker.items()]  # fmt: skip


SEGV = "killed by signal 11 (SIGSEGV) during decode"
NOTE = (
    "CPU self-check: the runner killed by signal 11 (SIGSEGV) during load with llama.cpp's "
    "extra buffer types (AMX, repacking), so models on this host load without them"
)


def test_it_lists_each_workers_runners_and_the_models_they_refuse_now(client, swap_client):
    swap_client(Reporting(w1=[
        runner("up", "running", pid=4242, restarts=1, last_exit=SEGV, last_exit_at=1.0),
        runner("loop", "backing off", restarts=3, crashes_in_a_row=3, last_exit=SEGV,
               retry_in=7.349, extra_bufts=False, note=NOTE),
        runner("broken", "failed", last_exit="load failed: bad magic"),
    ]))  # fmt: skip
    response = client.get("/healthz")

    # One model's crash loop does not make the appliance unhealthy: the others still answer.
    assert response.status_code == 200
    body = response.json()
    assert body["unusable_models"] == ["broken", "loop"]
    (worker,) = body["workers"]
    assert worker["worker"] == "w1"
    assert [r["model"] for r in worker["runners"]] == ["broken", "loop", "up"]
    broken, loop, up = worker["runners"]
    assert up == {"model": "up", "state": "running", "pid": 4242, "restarts": 1,
                  "last_exit": SEGV, "retry_in": None, "note": "", "usable": True}  # fmt: skip
    assert loop == {"model": "loop", "state": "backing off", "pid": None, "restarts": 3,
                    "last_exit": SEGV, "retry_in": 7.3, "note": NOTE, "usable": False}  # fmt: skip
    assert (broken["state"], broken["usable"]) == ("failed", False)
    assert broken["last_exit"] == "load failed: bad magic"


def test_a_runner_that_crashed_once_is_still_usable(client, swap_client):
    """The next request restarts it, so neither the answer nor the model's listing changes."""
    swap_client(Reporting(w1=[runner("m", "crashed", restarts=0, crashes_in_a_row=1,
                                     last_exit=SEGV, last_exit_at=1.0)]))  # fmt: skip
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json()["unusable_models"] == []
    assert response.json()["workers"][0]["runners"][0]["usable"] is True


def test_a_model_refused_by_one_worker_of_several_is_listed(client, swap_client):
    # Any worker may take a request from the queue: one that backs off is enough to refuse it.
    looping = runner("m", "backing off", crashes_in_a_row=2, retry_in=2.0)
    swap_client(Reporting(w2=[runner("m", "running", pid=7)], w1=[looping]))
    body = client.get("/healthz").json()
    assert body["unusable_models"] == ["m"]
    assert [w["worker"] for w in body["workers"]] == ["w1", "w2"]


@pytest.mark.parametrize("runners", ["x", [1, None, {"state": "running"}, {"model": 3}],
                                     [{"model": "m", "state": ["?"], "pid": True,
                                       "retry_in": float("nan")}]])  # fmt: skip
def test_malformed_runner_rows_do_not_break_it(client, swap_client, runners):
    swap_client(Reporting(w1=runners))
    response = client.get("/healthz")
    assert response.status_code == 200
    for row in response.json()["workers"][0]["runners"]:
        assert (row["model"], row["state"], row["pid"]) == ("m", "unknown", None)
        assert row["retry_in"] is None
