"""Keep-alive from the registry's settings, with a short clock: a model's own keep-alive, one
given with a request, idle unload by the host's sweeper and by the beat task."""

import pytest

from inference.catalog.importing import register_file
from inference.catalog.specs import spec_for
from inference.engine.host import EngineHost
from inference.engine.params import SamplingParams
from inference.jobs.tasks import unload_idle_models
from inference.serving import client as client_module
from inference.serving.client import EmbeddedClient, set_client
from tests.inference.engine.fakes import FakeRunner, ask, engines_on, wait_until

pytestmark = pytest.mark.django_db
TIMEOUT = 10.0


@pytest.fixture
def host():
    """A real host on fake runners, sweeping idle models every 20 ms."""
    host = EngineHost(engines_on(lambda config: FakeRunner(), itl_target=0.05), max_loaded=2)
    host.start_sweeper(interval=0.02)
    yield host
    host.shutdown()


@pytest.fixture
def model(tiny_file):
    return register_file(tiny_file, source="scan", hash_file=False)


def answer(host, spec, **kwargs):
    handle = host.submit(spec, ask("hello", SamplingParams(max_tokens=3), **kwargs))
    return handle.result(TIMEOUT)


def names(host) -> list[str]:
    return [row["name"] for row in host.loaded()]


def test_a_short_keep_alive_unloads_the_model_after_the_answer(host, model):
    model.keep_alive = "0.2s"
    spec = spec_for(model)
    assert spec.keep_alive == pytest.approx(0.2)

    assert answer(host, spec).type == "done"
    assert wait_until(lambda: names(host) == [], timeout=TIMEOUT)


def test_keep_alive_zero_unloads_right_after_the_answer(host, model):
    model.keep_alive = "0"
    assert answer(host, spec_for(model)).type == "done"
    assert wait_until(lambda: names(host) == [], timeout=TIMEOUT)


def test_a_negative_keep_alive_keeps_the_model_loaded(host, model):
    model.keep_alive = "-1"
    answer(host, spec_for(model))
    assert host.unload_idle() == []
    assert host.loaded()[0]["expires_in"] is None


def test_a_keep_alive_given_with_the_request_overrides_the_models(host, model):
    model.keep_alive = "-1"
    answer(host, spec_for(model), keep_alive=0.0)
    assert wait_until(lambda: names(host) == [], timeout=TIMEOUT)


def test_without_a_keep_alive_of_its_own_a_model_gets_the_servers_default(settings, model):
    settings.DEFAULT_KEEP_ALIVE = "90s"
    assert spec_for(model).keep_alive == 90.0


class UnsweptHost(EngineHost):
    def start_sweeper(self, interval: float = 0.5) -> None:
        """No sweeper: here only the beat task unloads."""


def test_the_beat_task_unloads_idle_models_of_the_embedded_host(model):
    host = UnsweptHost(engines_on(lambda config: FakeRunner()))
    previous = client_module._client
    set_client(EmbeddedClient(host))
    try:
        model.keep_alive = "0"
        answer(host, spec_for(model))
        assert wait_until(lambda: not host.get(model.name).busy)
        assert unload_idle_models() == [model.name]
        assert host.loaded() == []
    finally:
        set_client(previous)
        host.shutdown()


def test_in_split_mode_the_beat_task_unloads_what_the_snapshots_say_expired(monkeypatch):
    from inference.serving.split_client import SplitClient

    previous = client_module._client
    split = SplitClient("redis://127.0.0.1:1/0")  # the workers' side is stood in for below
    rows = [
        {"name": "expired", "expires_in": -0.5, "busy": False},
        {"name": "answering", "expires_in": 0.0, "busy": True},
        {"name": "fresh", "expires_in": 120.0, "busy": False},
        {"name": "forever", "expires_in": None, "busy": False},
    ]  # fmt: skip
    unloaded: list[str] = []
    monkeypatch.setattr(split, "snapshots", lambda: [{"worker": "w1", "loaded": rows}])
    monkeypatch.setattr(split, "_unload", lambda name: unloaded.append(name) or True)
    set_client(split)
    try:
        assert unload_idle_models() == ["expired"]
    finally:
        set_client(previous)
    assert unloaded == ["expired"]
