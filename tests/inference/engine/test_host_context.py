"""The host and a request's context: automatic contexts are sized before the load, a request
that needs more than the loaded engine holds reloads it once its answers ended, less never
reloads, and a reload the preflight refuses leaves the loaded model as it was."""

import dataclasses
import threading

import pytest

from inference.engine import host as host_module
from inference.engine.host import FALLBACK_CTX, EngineHost, ModelBusy, ModelSpec
from inference.engine.params import SamplingParams
from inference.engine.runner_config import RunnerConfig
from inference.planning.memory import InsufficientMemory
from tests.inference.engine.fakes import ask, engines_on

from .fakes import FakeRunner, wait_until

TIMEOUT = 10.0


class Factory:
    """FakeRunners shaped like the RunnerConfig they are given, one list per model."""

    def __init__(self):
        self.built: list[FakeRunner] = []
        self.configs: list[RunnerConfig] = []

    def __call__(self, config: RunnerConfig) -> FakeRunner:
        slots = config.parallel + config.cache_slots
        runner = FakeRunner(n_ctx=config.ctx_per_seq * slots, n_slots=slots,
                            ctx_per_seq=config.ctx_per_seq, n_batch=config.n_batch)  # fmt: skip
        self.built.append(runner)
        self.configs.append(config)
        return runner


class Sizer:
    """A preflight that sizes an automatic context to `auto` and refuses above `limit`."""

    def __init__(self, auto: int = 512, limit: int = 4096):
        self.auto, self.limit = auto, limit
        self.calls: list[tuple[ModelSpec, ModelSpec | None]] = []

    def __call__(self, spec: ModelSpec, replacing: ModelSpec | None = None) -> ModelSpec:
        self.calls.append((spec, replacing))
        ctx = max(spec.config.ctx_per_seq or self.auto, spec.min_ctx)
        if ctx > self.limit:
            raise InsufficientMemory(f"needs more than is free for {ctx} tokens per sequence")
        return dataclasses.replace(spec, config=dataclasses.replace(spec.config, ctx_per_seq=ctx))


def spec(ctx: int = 0, min_ctx: int = 0) -> ModelSpec:
    config = RunnerConfig("m.gguf", ctx_per_seq=ctx, parallel=2, cache_slots=2, n_batch=64)
    return ModelSpec("m", config, keep_alive=-1, min_ctx=min_ctx)


@pytest.fixture
def factory():
    return Factory()


@pytest.fixture
def sizer():
    return Sizer()


@pytest.fixture
def host(factory, sizer):
    host = EngineHost(engines_on(factory, itl_target=0.05), preflight=sizer)
    yield host
    host.shutdown()


def answer(host: EngineHost, model: ModelSpec, prompt: str = "hi"):
    return host.submit(model, ask(prompt, SamplingParams(max_tokens=3))).result(TIMEOUT)


def test_an_automatic_context_is_sized_by_the_preflight_before_the_load(host, factory):
    host.load(spec())
    assert [c.ctx_per_seq for c in factory.configs] == [512]
    assert host.loaded()[0]["ctx_per_seq"] == 512


def test_without_a_preflight_an_automatic_context_gets_the_fallback(factory):
    host = EngineHost(engines_on(factory, itl_target=0.05))
    try:
        host.load(spec())
        host.load(spec(min_ctx=FALLBACK_CTX * 2))  # what a request asks is honoured still
    finally:
        host.shutdown()
    assert [c.ctx_per_seq for c in factory.configs] == [FALLBACK_CTX, FALLBACK_CTX * 2]


def test_a_request_needing_more_reloads_the_model_with_that_context(host, factory, sizer):
    first, _ = host.load(spec())
    assert answer(host, spec()).finish_reason == "length"

    engine, _ = host.load(spec(min_ctx=2048))

    assert engine is not first and factory.built[0].closed
    assert [c.ctx_per_seq for c in factory.configs] == [512, 2048]
    assert sizer.calls[-1][1].config.ctx_per_seq == 512  # checked in place of the loaded one
    assert answer(host, spec(min_ctx=2048)).finish_reason == "length"


def test_a_request_needing_less_or_nothing_runs_on_what_is_loaded(host, factory):
    engine, _ = host.load(spec(min_ctx=2048))
    for smaller in (spec(), spec(min_ctx=1024), spec(ctx=256), spec(min_ctx=2048)):
        again, _ = host.load(smaller)
        assert again is engine
    assert len(factory.built) == 1


def test_a_larger_saved_setting_also_takes_effect_at_the_next_request(host, factory):
    host.load(spec(ctx=512))
    host.load(spec(ctx=1024))
    assert [c.ctx_per_seq for c in factory.configs] == [512, 1024]


def test_a_reload_that_cannot_fit_is_refused_and_the_loaded_model_stays(host, factory):
    engine, _ = host.load(spec())

    with pytest.raises(InsufficientMemory, match="8192 tokens per sequence"):
        host.load(spec(min_ctx=8192))

    assert host.get("m") is engine and not factory.built[0].closed
    assert answer(host, spec()).finish_reason == "length"


def test_a_reload_waits_for_the_running_answer_to_end(host, factory):
    engine, _ = host.load(spec())
    runner = factory.built[0]
    runner.gate = threading.Event()
    running = host.submit(spec(), ask("a long answer", SamplingParams(max_tokens=5)))
    wait_until(lambda: engine.busy, TIMEOUT)

    loaded = []
    reloading = threading.Thread(target=lambda: loaded.append(host.load(spec(min_ctx=1024))))
    reloading.start()
    reloading.join(0.3)
    assert reloading.is_alive() and not runner.closed  # waiting: the answer is still running

    runner.gate.set()
    assert running.result(TIMEOUT).finish_reason == "length"  # ended whole, not cut off
    reloading.join(TIMEOUT)
    assert loaded and loaded[0][0] is not engine
    assert [c.ctx_per_seq for c in factory.configs] == [512, 1024]


def test_a_reload_gives_up_on_an_answer_that_does_not_end(host, factory, monkeypatch):
    monkeypatch.setattr(host_module, "RELOAD_WAIT_S", 0.2)
    engine, _ = host.load(spec())
    runner = factory.built[0]
    runner.gate = threading.Event()
    running = host.submit(spec(), ask("a long answer", SamplingParams(max_tokens=5)))
    wait_until(lambda: engine.busy, TIMEOUT)

    with pytest.raises(ModelBusy, match="holds 512 tokens per sequence"):
        host.load(spec(min_ctx=1024))

    runner.gate.set()
    assert running.result(TIMEOUT).finish_reason == "length"
    assert host.get("m") is engine
