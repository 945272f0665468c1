"""Several inference workers on one Redis: each request goes to the worker the router chooses
(inference.serving.routing), for real: two (or three) worker processes, one llama.cpp thread
each, the real starter model, the split client in the test process.

The workers' boxes are told apart by their MODELS_DIR: every worker serves the packaged starter
model; "a copy only one box has" is the starter with a few bytes appended (another sha256, the
same weights), put in that worker's MODELS_DIR only."""

import asyncio
import dataclasses
import hashlib
import shutil
import uuid

import pytest

from inference.engine import GenerationRequest, SamplingParams
from inference.engine.host import ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.serving import split_protocol as protocol
from inference.serving.routing import CONVERSATION, LOADED
from inference.serving.split_client import WorkerError
from tests.split.fixtures import no_workers_left
from tests.split.streams import chat_prompt, collect, short

pytestmark = [pytest.mark.redis, pytest.mark.model]


@pytest.fixture(scope="module")
def starter_sha(starter_path) -> str:
    with open(starter_path, "rb") as f:
        return hashlib.file_digest(f, hashlib.sha256).hexdigest()


@pytest.fixture
def one_thread(starter_path, starter_sha) -> ModelSpec:
    """The starter, by content, with one llama.cpp thread: two workers share two cores."""
    config = RunnerConfig(model_path=str(starter_path), ctx_per_seq=1024, parallel=4,
                          cache_slots=4, n_threads=1)  # fmt: skip
    return ModelSpec("smollm2-135m-instruct", config, keep_alive=-1, sha256=starter_sha)


@pytest.fixture
def own_copy(tmp_path, starter_path, one_thread):
    """(MODELS_DIR holding a model no other box has, its spec): the starter's weights with
    another digest, at a path the web side never names (the worker finds it by content)."""
    models = tmp_path / "box-models"
    models.mkdir()
    path = models / "smollm2-own.gguf"
    shutil.copyfile(starter_path, path)
    with open(path, "ab") as f:
        f.write(b"\0" * 64)  # after the tensor data: llama.cpp and the reader ignore it
    with open(path, "rb") as f:
        sha = hashlib.file_digest(f, hashlib.sha256).hexdigest()
    config = dataclasses.replace(one_thread.config, model_path="/nowhere/on/the/web/box.gguf")
    return models, ModelSpec("smollm2-own", config, keep_alive=-1, sha256=sha)


@pytest.fixture
def workers(split_redis, start_worker, tmp_path):
    """Start n workers with empty MODELS_DIRs (each serves only the packaged starter)."""
    no_workers_left(split_redis)

    def start(n: int = 1, **env):
        started = [start_worker(wait=False, env=_box(tmp_path, **env)) for _ in range(n)]
        for worker in started:
            worker.wait_until_alive()
        return started

    return start


def _box(tmp_path, models_dir=None) -> dict:
    if models_dir is None:
        models_dir = tmp_path / f"empty-{uuid.uuid4().hex[:8]}"
        models_dir.mkdir()
    return {"MODELS_DIR": str(models_dir)}


def turn(history: str, text: str, key: str) -> GenerationRequest:
    params = SamplingParams(max_tokens=8, temperature=0.0)
    return GenerationRequest(history + chat_prompt(text), params,
                             model="smollm2-135m-instruct", cache_key=key)  # fmt: skip


async def converse(client, spec, key: str, texts: list[str]) -> list[dict]:
    """One conversation, turn after turn; the final event of each."""
    history, finals = "", []
    for text in texts:
        request = turn(history, text, key)
        final = (await collect(client, request, spec))[-1]
        assert final["type"] == "done", final
        history = request.prompt + final["text"] + "<|im_end|>\n"
        finals.append(final)
    return finals


async def test_every_later_turn_goes_to_the_worker_that_served_the_first_with_cached_tokens(
    split_client, workers, one_thread, starter_sha
):
    a, b = workers(2)
    for worker in (a, b):
        worker.wait_until_serving(starter_sha)
        await split_client.load(one_thread, worker=worker.name)  # a copy on each box

    conversations = await asyncio.gather(*(
        converse(split_client, one_thread, f"conversation-{n}",
                 [f"Name {n + 2} fruits.", "Name another.", "And a third?"])
        for n in range(4)
    ))  # fmt: skip

    served_by = {finals[0]["route"]["worker"] for finals in conversations}
    assert served_by <= {a.name, b.name}
    for finals in conversations:
        first, *later = finals
        for final in later:
            assert final["route"] == {"worker": first["route"]["worker"], "reason": CONVERSATION}
            assert final["figures"]["cached_tokens"] > 0


async def test_a_model_loaded_on_one_worker_only_is_routed_there_and_loaded_once(
    split_client, workers, one_thread, starter_sha
):
    a, b = workers(2)
    for worker in (a, b):
        worker.wait_until_serving(starter_sha)
    await split_client.load(one_thread, worker=b.name)
    await split_client.load(one_thread)  # the router's choice: where it is loaded already

    finals = [(await collect(split_client, short(f"Say {word}."), one_thread))[-1]
              for word in ("one", "two", "three")]  # fmt: skip

    assert [f["route"] for f in finals] == [{"worker": b.name, "reason": LOADED}] * 3
    loaded = {x.worker: [m.name for m in x.loaded] for x in split_client.announcements()}
    assert loaded == {a.name: [], b.name: ["smollm2-135m-instruct"]}


async def test_a_worker_without_a_copy_is_never_chosen_and_refuses_a_load_clearly(
    split_client, workers, own_copy, starter_sha
):
    models_dir, spec = own_copy
    (holder,) = workers(1, models_dir=models_dir)
    (empty,) = workers(1)
    holder.wait_until_serving(spec.sha256)
    empty.wait_until_serving(starter_sha)

    finals = [(await collect(split_client, short(f"Say {word}."), spec))[-1]
              for word in ("one", "two", "three")]  # fmt: skip

    assert all(f["type"] == "done" for f in finals), finals
    assert {f["route"]["worker"] for f in finals} == {holder.name}
    with pytest.raises(WorkerError, match=f"{empty.name} has no copy of smollm2-own"):
        await split_client.load(spec, worker=empty.name)
    assert [a.loaded for a in split_client.announcements() if a.worker == empty.name] == [()]


async def test_a_killed_worker_s_queued_request_and_its_conversation_go_to_the_other(
    split_client, workers, one_thread, starter_sha, split_redis
):
    a, b = workers(2)
    for worker in (a, b):
        worker.wait_until_serving(starter_sha)
        await split_client.load(one_thread, worker=worker.name)
    first = (await collect(split_client, turn("", "Name a fruit.", "kept"), one_thread))[-1]
    doomed = a if first["route"]["worker"] == a.name else b
    other = b if doomed is a else a

    doomed.kill()  # its heartbeat lives on for a moment: the next turn is routed to it
    history = turn("", "Name a fruit.", "kept").prompt + first["text"] + "<|im_end|>\n"
    second = (await collect(split_client, turn(history, "Another?", "kept"), one_thread))[-1]

    assert second["type"] == "done", second
    assert second["route"]["worker"] == other.name
    # It had been sent to the dead worker's queue first, and that copy stays unrun there.
    assert split_redis.llen(protocol.worker_queue(doomed.name)) == 1
    history = turn(history, "Another?", "kept").prompt + second["text"] + "<|im_end|>\n"
    third = (await collect(split_client, turn(history, "And one more?", "kept"), one_thread))[-1]
    assert third["route"] == {"worker": other.name, "reason": CONVERSATION}
    assert third["figures"]["cached_tokens"] > 0


async def test_a_worker_started_during_the_test_receives_work(
    split_client, workers, own_copy, one_thread, starter_sha
):
    (first,) = workers(1)
    first.wait_until_serving(starter_sha)
    models_dir, spec = own_copy

    (joined,) = workers(1, models_dir=models_dir)
    joined.wait_until_serving(spec.sha256)
    final = (await collect(split_client, short(), spec))[-1]

    assert final["type"] == "done", final
    assert final["route"]["worker"] == joined.name
