"""The host: loading, unloading, keep-alive and LRU eviction, with a factory of fake runners."""

import time

import pytest

from inference.engine.host import EngineHost, ModelBusy, ModelSpec
from inference.engine.params import SamplingParams
from tests.inference.engine.fakes import ask, engines_on

from .fakes import FakeRunner, wait_until

TIMEOUT = 10.0


class Factory:
    """Builds a FakeRunner from a spec's config (a dict of its arguments), taking `load_s`."""

    def __init__(self, load_s: float = 0.0):
        self.load_s = load_s
        self.built: dict[str, list[FakeRunner]] = {}

    def __call__(self, config: dict) -> FakeRunner:
        time.sleep(self.load_s)
        config = dict(config)
        name = config.pop("name")
        runner = FakeRunner(**config)
        self.built.setdefault(name, []).append(runner)
        return runner


def spec(name: str, keep_alive: float = 300.0, **runner) -> ModelSpec:
    return ModelSpec(name, {"name": name, **runner}, keep_alive=keep_alive)


@pytest.fixture
def factory():
    return Factory()


@pytest.fixture
def host(factory):
    host = EngineHost(engines_on(factory, itl_target=0.05), max_loaded=2)
    yield host
    host.shutdown()


def answer(host: EngineHost, model: ModelSpec, prompt: str = "hi", max_tokens: int = 3, **kw):
    asked = ask(prompt, SamplingParams(max_tokens=max_tokens), **kw)
    return host.submit(model, asked).result(TIMEOUT)


def test_load_starts_an_engine_once_and_reuses_it(host, factory):
    engine, _ = host.load(spec("a"))
    again, waited = host.load(spec("a"))
    assert again is engine
    assert waited < 0.05
    assert len(factory.built["a"]) == 1
    (row,) = host.loaded()
    assert row["name"] == "a" and row["busy"] is False and row["size_bytes"] == 1000
    assert answer(host, spec("a")).finish_reason == "length"


def test_unload_stops_the_engine_and_closes_the_runner(host, factory):
    engine, _ = host.load(spec("a"))
    assert host.unload("a") is True
    assert factory.built["a"][0].closed
    assert host.get("a") is None and host.loaded() == []
    assert host.unload("a") is False


def test_unloading_a_busy_model_needs_force(host, factory):
    model = spec("a", overhead=0.003)
    handle = host.submit(model, ask("busy", SamplingParams(max_tokens=1000)))
    with pytest.raises(ModelBusy):
        host.unload("a")
    assert host.unload("a", force=True)
    assert handle.result(timeout=TIMEOUT).type == "error"


def test_the_least_recently_used_model_is_evicted_at_max_loaded(host, factory):
    host.load(spec("a"))
    host.load(spec("b"))
    host.load(spec("a"))  # a is now the more recently used
    host.load(spec("c"))
    assert sorted(row["name"] for row in host.loaded()) == ["a", "c"]
    assert factory.built["b"][0].closed
    assert not factory.built["a"][0].closed


def test_a_model_cannot_be_evicted_while_it_is_answering(factory):
    host = EngineHost(engines_on(factory), max_loaded=1)
    try:
        busy = host.submit(spec("a", overhead=0.002), ask("long", SamplingParams(max_tokens=50)))
        with pytest.raises(ModelBusy):
            host.load(spec("b"))
        assert busy.result(timeout=TIMEOUT).finish_reason == "length"
        assert wait_until(lambda: not host.get("a").busy)
        host.load(spec("b"))
        assert [row["name"] for row in host.loaded()] == ["b"]
        assert factory.built["a"][0].closed
    finally:
        host.shutdown()


def test_keep_alive_zero_unloads_right_after_the_answer(host, factory):
    model = spec("a", keep_alive=0)
    assert answer(host, model).finish_reason == "length"
    unloaded = []
    assert wait_until(lambda: unloaded.extend(host.unload_idle()) or unloaded)
    assert unloaded == ["a"]
    assert factory.built["a"][0].closed


def test_keep_alive_zero_never_unloads_a_model_while_it_is_answering(host, factory):
    model = spec("a", keep_alive=0, overhead=0.002)
    handle = host.submit(model, ask("long", SamplingParams(max_tokens=40)))
    assert wait_until(lambda: factory.built["a"][0].steps)
    assert host.unload_idle() == []
    assert handle.result(timeout=TIMEOUT).type == "done"


def test_a_negative_keep_alive_never_unloads(host, factory):
    model = spec("a", keep_alive=-1)
    answer(host, model)
    time.sleep(0.05)
    assert host.unload_idle() == []
    assert host.loaded()[0]["expires_in"] is None


def test_keep_alive_counts_from_the_last_answer(host, factory):
    model = spec("a", keep_alive=0.3)
    answer(host, model)
    assert host.unload_idle() == []
    assert 0 < host.loaded()[0]["expires_in"] <= 0.3
    assert wait_until(lambda: host.unload_idle() == ["a"], timeout=3)


def test_a_keep_alive_given_with_a_request_overrides_the_models(host, factory):
    answer(host, spec("a", keep_alive=-1), keep_alive=0)
    assert wait_until(lambda: host.unload_idle() == ["a"])


def test_the_load_time_is_charged_to_the_first_request_only():
    factory = Factory(load_s=0.2)
    host = EngineHost(engines_on(factory))
    try:
        first = answer(host, spec("a"))
        second = answer(host, spec("a"))
    finally:
        host.shutdown()
    assert first.figures["load_time"] >= 0.2
    assert first.figures["ttft"] >= first.figures["load_time"]
    assert first.figures["timeline"][0]["phase"] == "load"
    assert first.figures["queue_time"] < 0.2
    assert second.figures["load_time"] == 0.0
    assert host.loaded() == []


def test_a_failed_preflight_loads_nothing(factory):
    def refuse(spec: ModelSpec) -> None:
        raise MemoryError(f"{spec.name} does not fit")

    host = EngineHost(engines_on(factory), preflight=refuse)
    with pytest.raises(MemoryError):
        host.load(spec("a"))
    assert host.loaded() == [] and factory.built == {}
    assert host.loading is None


def test_snapshots_cover_every_loaded_model(host):
    host.load(spec("a"))
    host.load(spec("b"))
    snaps = host.snapshots()
    assert set(snaps) == {"a", "b"}
    assert snaps["a"]["name"] == "a" and snaps["a"]["queue_depth"] == 0
