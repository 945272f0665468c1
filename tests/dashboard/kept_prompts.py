"""Kept prompts (warm memory) behind the inference client, for the web side's tests: a host of
fake runners whose engine keeps prompts in a real PromptStore, and a real disk tier of files
under the test's own data directory, where the embedded client forgets them."""

from pathlib import Path
from types import SimpleNamespace

import pytest

from inference.engine.host import EngineHost
from inference.engine.tiers import KvLayout, PromptStore, files
from inference.engine.tiers.disk import DiskTier
from inference.serving import client as client_module
from inference.serving.client import EmbeddedClient, set_client
from inference.serving.hosting import EMBEDDED, prompt_cache_config
from tests.inference.engine.fakes import FakeRunner, engines_on

SHA, OTHER = "ab" * 32, "cd" * 32  # two models' sha256


@pytest.fixture
def kept(settings, tmp_path):
    """get_client() answers with a host whose engines keep prompts in `store`; the worker's
    disk tier is `directory`. The previous client comes back after."""
    settings.DATA_DIR = tmp_path
    store = PromptStore(1 << 20)
    host = EngineHost(engines_on(lambda config: FakeRunner(), prompts=store), max_loaded=2)
    previous = client_module._client
    set_client(EmbeddedClient(host))
    yield SimpleNamespace(host=host, store=store,
                          directory=Path(prompt_cache_config(EMBEDDED).directory))  # fmt: skip
    set_client(previous)
    host.shutdown()


def keep(store: PromptStore, *partitions: str) -> None:
    """A prompt kept in RAM for each partition, as an engine saves a sequence's KV."""
    for n, partition in enumerate(partitions):
        store.put(partition, f"c{n}", list(range(100 * n, 100 * n + 20)), bytearray(b"s" * 64))


def _layout(sha: str) -> KvLayout:
    return KvLayout(sha, 1, 1, 256, "f16", True, -1, "fake 1")


def on_disk(directory: Path, sha: str, partitions: list[str]) -> None:
    """Kept prompts of the model `sha` in the worker's disk tier, as a runner leaves them when
    it stops."""
    store = PromptStore(1 << 20, DiskTier(directory, _layout(sha), 1 << 30)).open()
    keep(store, *partitions)
    store.flush(10)
    store.close()


def files_of(directory: Path, sha: str) -> int:
    return len(list((directory / sha).glob(f"*/*{files.SUFFIX}")))


def partitions_in(store: PromptStore) -> list[str]:
    return sorted(entry.partition for entry in store.held())


def partitions_on_disk(directory: Path, sha: str) -> list[str]:
    """The partitions of the model's kept prompts on disk, as a runner loading it finds them."""
    store = PromptStore(1 << 20, DiskTier(directory, _layout(sha), 1 << 30)).open()
    try:
        return partitions_in(store)
    finally:
        store.close()
