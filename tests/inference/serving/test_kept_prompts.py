"""Forgetting kept prompts on a box: a loaded model's runner drops its own, the files of models
that are not loaded are deleted from disk, one partition's or everything of one model."""

import threading
import time

import numpy as np
import pytest

from inference.engine.host import EngineHost, ModelSpec
from inference.engine.runner_config import RunnerConfig
from inference.engine.tiers import KvLayout, PromptStore, files
from inference.engine.tiers.disk import DiskTier
from inference.serving.kept_prompts import forget
from tests.inference.engine.fakes import FakeRunner, engines_on

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


def test_a_directory_a_runner_holds_is_left_to_that_runner(tmp_path, host):
    kept_on_disk(tmp_path, SHA, ["apikey:1"])
    held = PromptStore(1 << 20, DiskTier(tmp_path, layout(SHA), 1 << 30)).open()
    assert forget(host, tmp_path, partition="apikey:1").on_disk == 0
    assert held.lookup("apikey:1", np.arange(20, dtype=np.int32)) is not None
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


def test_a_runner_still_writing_its_ram_tier_after_an_unload_is_waited_for(tmp_path, host):
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
    forgotten = forget(host, tmp_path, model=spec(SHA), everything=True)
    writer.join()
    assert forgotten.on_disk == 2 and not (tmp_path / SHA).exists()
