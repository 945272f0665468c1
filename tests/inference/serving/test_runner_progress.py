"""Progress reaches the page from a real runner process: the load, the queue, the prompt read
chunk by chunk beside a stream, and the step telemetry over IPC (llama.cpp, the starter model)."""

import asyncio

import pytest

from inference.engine import GenerationRequest, SamplingParams
from inference.engine.host import EngineHost, ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.serving.core import serve
from inference.serving.supervisor import RunnerSupervisor

pytestmark = pytest.mark.model

CHAT = "<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
LONG = (
    "Here is a list of the things in my shed: "
    + ", ".join(f"a box number {i} with screws" for i in range(40))
    + ". Which box should I open first?"
)


@pytest.fixture
def host(tmp_path, starter_path, extra_bufts):
    host = EngineHost(engine_factory=RunnerSupervisor(state_dir=tmp_path).start, max_loaded=1)
    yield host
    host.shutdown()


@pytest.fixture
def spec(starter_path, extra_bufts) -> ModelSpec:
    # Two sequences and 32-token steps: a long prompt takes many steps beside a stream.
    config = RunnerConfig(
        str(starter_path), ctx_per_seq=1024, parallel=2, cache_slots=0, n_batch=32,
        n_ubatch=32, n_threads=2, use_extra_bufts=extra_bufts,
    )  # fmt: skip
    return ModelSpec("smol-progress", config, -1)


async def collect(host, spec, question: str, max_tokens: int, into: list) -> None:
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    generation = GenerationRequest(CHAT.format(question=question), params, model=spec.name)
    async for event in serve(host, generation, spec):
        into.append(event)


async def test_progress_events_cross_the_runner_process_boundary(host, spec):
    # 1. The first request loads the model, and says so before anything else.
    first: list[dict] = []
    await collect(host, spec, "Say hi.", 4, first)
    assert first[0] == {"type": "phase", "phase": "loading", "request_id": first[-1]["request_id"],
                        "model": spec.name}  # fmt: skip
    assert first[-1]["type"] == "done"

    # 2. A stream, a long prompt beside it, and a third request that has to wait for a slot.
    stream, long, queued = [], [], []
    writing = asyncio.create_task(collect(host, spec, "Count from one to fifty.", 120, stream))
    while not any(e["type"] == "token" for e in stream):
        await asyncio.sleep(0.02)
    reading = asyncio.create_task(collect(host, spec, LONG, 4, long))
    while not any(e["type"] == "progress" for e in long):
        await asyncio.sleep(0.01)
    waiting = asyncio.create_task(collect(host, spec, "Name a fruit.", 4, queued))
    snapshots = []
    while not reading.done():
        snapshots.append(host.get(spec.name).snapshot())  # over the runner's IPC
        await asyncio.sleep(0.05)
    await asyncio.gather(writing, reading, waiting)

    read = [e for e in long if e["type"] == "progress"]
    total = read[0]["total"]
    assert total > 200 and all(e["phase"] == "prefilling" for e in read)
    assert len(read) >= total // 32  # a chunk at a time, every chunk reported
    dones = [e["done"] for e in read]
    assert dones == sorted(dones) and dones[-1] == total and dones[0] == read[0]["cached"]
    assert {frozenset(e) for e in read} == {
        frozenset({"type", "request_id", "phase", "done", "total", "cached"})
    }
    assert [e["type"] for e in long if e["type"] != "progress"][-1] == "done"

    places = [e for e in queued if e["type"] == "progress" and e["phase"] == "waiting"]
    assert places and places[-1]["ahead"] == 0
    assert set(places[0]) == {"type", "request_id", "phase", "ahead"}
    assert queued[-1]["type"] == "done"

    # 3. The snapshots saw steps that carried prompt tokens beside the stream's decode token.
    mixed = [
        (d, p)
        for snap in snapshots
        for d, p in zip(snap["steps"]["decode"], snap["steps"]["prompt"], strict=True)
        if d and p
    ]
    assert mixed and all(d + p <= 32 for d, p in mixed)
    assert any(row["phase"] == "decoding" for snap in snapshots for row in snap["streams"])
    assert snapshots[-1]["windows"]["30"]["itl"]["count"] > 0
