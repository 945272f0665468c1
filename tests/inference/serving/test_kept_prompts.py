"""Forgetting kept prompts on a box: a loaded model's runner drops its own, the files of models
that are not loaded are deleted from disk, one partition's or everything of one model; and
whatever a runner is doing when it happens (stopping, starting, taking a directory over, killed
before its deletes ran), nothing forgotten is left."""

import threading
import time

import numpy as np
import pytest

from inference.engine.engine import Engine
from inference.engine.host import EngineHost, ModelSpec
from inference.engine.params import SamplingParams
from inference.engine.runner_config import RunnerConfig
from inference.engine.tiers import KvLayout, PromptStore, files
from inference.engine.tiers.disk import DiskTier
from inference.serving import kept_prompts
from inference.serving.kept_prompts import forget
from tests.inference.engine.fakes import FakeRunner, ask, engines_on, wait_until

SHA, OTHER = "ab" * 32, "cd" * 32


def layout(sha: str) -> KvLayout:
    return KvLayout(sha, 1, 1, 256, "f16", True, -1, "fake 1")


def kept_on_disk(directory, sha: str, partitions: list[str]) -> None:
    store = PromptStore(1 << 20, DiskTier(directory, layout(sha), 1 << 30)).open()
    for n, partition in enumerate(partitions):
        store.put(partition, f"c{n}", list(range(100 * n, 100 * n + 20)), bytearray(b"s" * 64))
    store.flush(10)
    store.close()


def on_disk(directory, sha: str) -> int:
    return len(list((directory / sha).glob(f"*/*{files.SUFFIX}")))


@pytest.fixture
def host():
    made = EngineHost(engines_on(lambda config: FakeRunner()), max_loaded=2)
    yield made
    made.shutdown()


def spec(sha: str) -> ModelSpec:
    return ModelSpec(f"model-{sha[:2]}", RunnerConfig(model_path="/m.gguf"), sha256=sha)


def test_a_partitions_kept_prompts_go_from_every_models_files(tmp_path, host):
    kept_on_disk(tmp_path, SHA, ["apikey:1", "apikey:2", "apikey:1"])
    kept_on_disk(tmp_path, OTHER, ["apikey:1"])
    forgotten = forget(host, tmp_path, partition="apikey:1")
    assert forgotten.on_disk == 3 and on_disk(tmp_path, SHA) == 1 and on_disk(tmp_path, OTHER) == 0


def test_everything_of_one_model_goes_and_the_others_stay(tmp_path, host):
    kept_on_disk(tmp_path, SHA, ["apikey:1", "apikey:2"])
    kept_on_disk(tmp_path, OTHER, ["apikey:1"])
    assert forget(host, tmp_path, model=spec(SHA), everything=True).on_disk == 2
    assert not (tmp_path / SHA).exists() and on_disk(tmp_path, OTHER) == 1


def test_a_directory_a_runner_holds_is_forgotten_by_that_runner(tmp_path, host):
    kept_on_disk(tmp_path, SHA, ["apikey:1", "apikey:2"])
    held = PromptStore(1 << 20, DiskTier(tmp_path, layout(SHA), 1 << 30)).open()
    forget(host, tmp_path, partition="apikey:1")
    assert held.lookup("apikey:1", np.arange(20, dtype=np.int32)) is None
    assert partitions_on_disk(tmp_path) == ["apikey:2"]
    held.close()


def test_loaded_engines_forget_their_own(tmp_path):
    store = PromptStore(1 << 20)
    made = EngineHost(engines_on(lambda config: FakeRunner(), prompts=store), max_loaded=2)
    made.load(ModelSpec("m", {}, sha256=SHA))
    for partition in ("apikey:9", "apikey:8"):
        store.put(partition, "c", list(range(20)), bytearray(b"s" * 64))
    assert forget(made, tmp_path, partition="apikey:9").loaded == 1
    assert [e.partition for e in store.held()] == ["apikey:8"]
    made.shutdown()


def test_forgetting_nobody_in_particular_is_refused(tmp_path, host):
    with pytest.raises(ValueError):
        forget(host, tmp_path)


def test_a_runner_writing_its_ram_tier_after_an_unload_forgets_what_it_writes(tmp_path, host):
    kept_on_disk(tmp_path, SHA, ["apikey:1"])
    stopping = PromptStore(1 << 20, DiskTier(tmp_path, layout(SHA), 1 << 30)).open()
    stopping.put("apikey:1", "late", list(range(500, 520)), bytearray(b"l" * 64))
    stopping.disk.flushing()  # stopped: its RAM tier is on its way to disk

    def finish() -> None:
        time.sleep(0.5)
        stopping.flush(10)
        stopping.close()

    writer = threading.Thread(target=finish)
    writer.start()
    forget(host, tmp_path, model=spec(SHA), everything=True)
    writer.join()
    assert partitions_on_disk(tmp_path) == []


# --- a forget cannot be outrun: whatever a runner is doing, nothing forgotten is left --------


def partitions_on_disk(directory) -> list[str]:
    """The partitions of every entry file under a worker's directory, sorted."""
    return sorted(files._header_of(path)["partition"]
                  for path in directory.glob(f"*/*/*{files.SUFFIX}"))  # fmt: skip


def answer(engine: Engine, text: str, partition: str) -> None:
    handle = engine.submit(ask(text, SamplingParams(temperature=0, max_tokens=4),
                               cache_key=partition, cache_partition=partition))  # fmt: skip
    assert list(handle.events(timeout=10))[-1].type == "done"


def test_a_forget_while_a_runner_stops_is_not_written_back_by_its_flush(tmp_path, host):
    # Its engine has stopped (out of the host): what its slots held went into its RAM tier,
    # its lock still says "serving", and its flush is about to write the RAM tier to disk.
    store = PromptStore(1 << 20, DiskTier(tmp_path, layout(SHA), 1 << 30)).open()
    engine = Engine(FakeRunner(n_slots=2, n_ctx=512), prompts=store).start()
    answer(engine, "Mine: the kitchen light, the hall light and the heating. ", "apikey:1")
    answer(engine, "Theirs: the front door lock and the garage door opener. ", "apikey:2")
    engine.shutdown(timeout=5)
    assert files.marked(tmp_path / SHA / layout(SHA).digest) == "serving"
    forget(host, tmp_path, partition="apikey:1")
    engine.persist_prompts(10)
    assert partitions_on_disk(tmp_path) == ["apikey:2"]


def test_a_forget_between_a_runners_store_opening_and_ready_is_done_by_it(tmp_path, host):
    kept_on_disk(tmp_path, SHA, ["apikey:1", "apikey:2"])
    store = PromptStore(1 << 20, DiskTier(tmp_path, layout(SHA), 1 << 30)).open()
    forget(host, tmp_path, partition="apikey:1")  # the host does not have it yet
    engine = Engine(FakeRunner(n_slots=2, n_ctx=512), prompts=store).start()  # Ready
    assert store.lookup("apikey:1", np.arange(20, dtype=np.int32)) is None
    assert partitions_on_disk(tmp_path) == ["apikey:2"]
    engine.shutdown(timeout=5)
    engine.persist_prompts(10)
    assert partitions_on_disk(tmp_path) == ["apikey:2"]


def test_a_takeover_that_wins_the_lock_from_a_forget_forgets_too(tmp_path, host, monkeypatch):
    kept_on_disk(tmp_path, SHA, ["apikey:1", "apikey:2"])
    stopping = PromptStore(1 << 20, DiskTier(tmp_path, layout(SHA), 1 << 30)).open()
    stopping.disk.flushing()
    starting = PromptStore(1 << 20, DiskTier(tmp_path, layout(SHA), 1 << 30)).open()
    assert starting.disk is None  # RAM only until the stopping runner lets go
    lock = files.lock

    def the_takeover_first(directory):
        """The forget's first try for the lock comes just after the takeover got it."""
        if threading.current_thread() is threading.main_thread() and starting.disk is None:
            stopping.disk.close()  # as its process exits: the lock goes with it
            assert wait_until(lambda: starting.disk is not None)
        return lock(directory)

    monkeypatch.setattr(files, "lock", the_takeover_first)
    forget(host, tmp_path, partition="apikey:1")
    assert starting.lookup("apikey:1", np.arange(20, dtype=np.int32)) is None
    assert partitions_on_disk(tmp_path) == ["apikey:2"]
    starting.close()


def test_a_runner_starting_while_a_forget_holds_its_directory_takes_it_over_after(
    tmp_path, host, monkeypatch
):
    kept_on_disk(tmp_path, SHA, ["apikey:1", "apikey:2"])
    mark, started = files.mark, []

    def a_runner_starts(handle, state: str) -> None:
        mark(handle, state)
        if not started:  # the forget has the lock now
            started.append(PromptStore(1 << 20, DiskTier(tmp_path, layout(SHA), 1 << 30)).open())

    monkeypatch.setattr(files, "mark", a_runner_starts)
    forget(host, tmp_path, partition="apikey:1")
    (starting,) = started
    assert wait_until(lambda: starting.disk is not None)  # not RAM only for its whole life
    assert [e.partition for e in starting.held()] == ["apikey:2"]
    starting.close()


def test_a_runner_killed_before_its_deletes_ran_brings_nothing_back(tmp_path, monkeypatch):
    monkeypatch.setattr(kept_prompts, "FLUSH_S", 0.5)
    kept_on_disk(tmp_path, SHA, ["apikey:1", "apikey:2"])
    store = PromptStore(1 << 20, DiskTier(tmp_path, layout(SHA), 1 << 30)).open()
    loaded = EngineHost(engines_on(lambda config: FakeRunner(), prompts=store), max_loaded=1)
    loaded.load(spec(SHA))
    store.disk._jobs.put(None)  # its disk thread stops: the deletions it is given never run
    store.disk._thread.join(5)
    assert forget(loaded, tmp_path, partition="apikey:1").loaded == 1
    store.disk._lock_handle.close()  # killed: its lock goes with it
    again = PromptStore(1 << 20, DiskTier(tmp_path, layout(SHA), 1 << 30)).open()
    assert again.lookup("apikey:1", np.arange(20, dtype=np.int32)) is None
    assert partitions_on_disk(tmp_path) == ["apikey:2"]
    again.close()
    loaded.shutdown()


def test_a_models_prompts_kept_before_its_digest_was_known_are_forgotten_with_it(tmp_path, host):
    by_path = KvLayout("file:/models/m.gguf", 1, 1, 256, "f16", True, -1, "fake 1")
    store = PromptStore(1 << 20, DiskTier(tmp_path, by_path, 1 << 30)).open()
    store.put("apikey:1", "c", list(range(20)), bytearray(b"s" * 64))
    store.flush(10)
    store.close()
    kept_on_disk(tmp_path, SHA, ["apikey:2"])
    model = ModelSpec("m", RunnerConfig(model_path="/models/m.gguf"), sha256=SHA)
    assert forget(host, tmp_path, model=model, everything=True).on_disk == 2
    assert partitions_on_disk(tmp_path) == []
