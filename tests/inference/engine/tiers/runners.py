"""Runners of several models on one tree of kept prompts, for the disk bound's tests: a store
each, in this process or in a process of its own (`runner`, importable by a spawned child)."""

import time
from pathlib import Path

from inference.engine.tiers import KvLayout, PromptStore
from inference.engine.tiers.disk import DiskTier

BOUND = 60_000
STATE = 2_000  # an entry's state; its file is ~2.5 KB with its header and token ids


def model_layout(model: str) -> KvLayout:
    return KvLayout(model=model * 32, file_size=1000, file_mtime_ns=1, ctx_per_seq=256,
                    kv_type="f16", flash_attn=True, n_gpu_layers=-1,
                    state_format="fake 1")  # fmt: skip


def tree_bytes(root: Path) -> int:
    """What the tree's entries and temporary files take now."""
    return sum(directory_bytes(directory) for directory in root.glob("*/*"))


def directory_bytes(directory: Path) -> int:
    total = 0
    for path in directory.glob("*"):
        try:
            total += path.stat().st_size if path.suffix in (".kv", ".tmp") else 0
        except FileNotFoundError:  # deleted meanwhile
            continue
    return total


def keep(store: PromptStore, count: int, start: int = 0) -> None:
    """`count` conversations put into a store whose RAM holds one: each spills the one before.
    The saves come a step apart, as an engine's do: each write is over before the next save
    (a save never waits for one, and finds no room while the last is still being written)."""
    for n in range(start, start + count):
        tokens = list(range(1000 * n, 1000 * n + 20))
        store.put("p", f"c{n}", tokens, bytearray(bytes([n % 251]) * STATE))
        if store.disk is not None:
            store.disk.drain(10)


def opened(root: Path, model: str, bound: int = BOUND) -> PromptStore:
    return PromptStore(STATE + 100, DiskTier(root, model_layout(model), bound)).open()


def on_disk(store: PromptStore) -> int:
    return directory_bytes(store.disk.directory)


def wait_for(condition, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def runner(root: str, model: str, go, done) -> None:
    """A runner process: opens on the tree, waits for the start, keeps 40 prompts, stops."""
    store = opened(Path(root), model)
    go.wait()
    keep(store, 40)
    store.flush(30)
    done.put((model, on_disk(store)))
    store.close()
