"""Embeddings from a runner process on real llama.cpp with the starter model, through the host
as the appliance asks for them: the same bytes as in-process, and a native fault mid-embedding
that ends the request with the reason instead of a hang."""

import os
import signal
import time

import pytest

from inference.engine import EngineStopped, RefusalKind, Refused
from inference.engine.host import EngineHost, ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.serving.supervisor import RunnerSupervisor

pytestmark = pytest.mark.model

TEXTS = ["Why is the sky blue?", "hello", [1, 2, 3]]


@pytest.fixture
def spec(starter_path, extra_bufts) -> ModelSpec:
    config = RunnerConfig(str(starter_path), ctx_per_seq=512, parallel=2, cache_slots=0,
                          n_threads=2, use_extra_bufts=extra_bufts)  # fmt: skip
    return ModelSpec("smol", config, -1)


@pytest.fixture
def supervisor(tmp_path):
    return RunnerSupervisor(state_dir=tmp_path)


@pytest.fixture
def host(supervisor):
    host = EngineHost(engine_factory=supervisor.start)
    yield host
    host.shutdown()


def test_a_runner_process_embeds_exactly_as_the_engine_does_in_process(host, spec):
    from inference.engine import Engine
    from inference.engine.runner import LlamaRunner

    future, waited = host.embed(spec, TEXTS)
    remote = future.result(timeout=300)
    assert waited > 0  # this call loaded the model
    local_engine = Engine(LlamaRunner(spec.config)).start()
    try:
        local = local_engine.embed(TEXTS).result(timeout=300)
    finally:
        local_engine.shutdown()
    assert remote.data == local.data
    assert remote.token_counts == local.token_counts
    assert not host.get("smol").busy


def test_a_refusal_in_the_runner_comes_back_as_the_same_exception(host, spec):
    future, _ = host.embed(spec, [[1, 10_000_000]])
    with pytest.raises(Refused) as refused:  # across the runner channel: a Refused of its kind
        future.result(timeout=300)
    assert (refused.value.kind, refused.value.field) == (RefusalKind.INVALID, "input")


def test_a_segfault_mid_embedding_ends_it_with_the_reason(host, supervisor, spec):
    host.load(spec)
    future, _ = host.embed(spec, ["a long text to embed, " * 60] * 64)
    assert host.get("smol").busy  # the keep-alive sweep leaves it alone meanwhile
    (row,) = supervisor.states()
    time.sleep(0.5)
    os.kill(row["pid"], signal.SIGSEGV)
    with pytest.raises(EngineStopped, match="killed by signal 11"):
        future.result(timeout=10)
    again, _ = host.embed(spec, ["hello"])  # the next request loads it anew
    assert again.result(timeout=300).count == 1
