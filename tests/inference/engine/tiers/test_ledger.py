"""The disk bound is the box's: it holds for the whole tree at every moment, shared by the
runners that are alive, whenever they open, write, flush or stop."""

import json
import multiprocessing
import threading
import time

import numpy as np

from inference.engine.tiers import PromptStore, files, forgets
from inference.engine.tiers.disk import DiskTier
from inference.engine.tiers.ledger import LEDGER, tree_locked
from tests.inference.engine.tiers.runners import (
    BOUND,
    STATE,
    directory_bytes,
    keep,
    model_layout,
    on_disk,
    opened,
    runner,
    tree_bytes,
    wait_for,
)


def test_two_runners_writing_at_once_hold_the_bound_together(tmp_path):
    """Two runner processes open on an empty tree (each once took the whole bound: twice the
    bound on disk) and write at once; the tree, measured while they write, never passes it."""
    context = multiprocessing.get_context("spawn")
    go, done = context.Event(), context.Queue()
    processes = [context.Process(target=runner, args=(str(tmp_path), model, go, done))
                 for model in ("ab", "cd")]  # fmt: skip
    for process in processes:
        process.start()
    peak = 0
    go.set()
    while any(p.is_alive() for p in processes):
        with tree_locked(tmp_path):  # nothing is reserved meanwhile: a sound reading
            peak = max(peak, tree_bytes(tmp_path))
        time.sleep(0.01)
    for process in processes:
        process.join(30)
        assert process.exitcode == 0
    held = dict(done.get(timeout=5) for _ in processes)
    assert peak <= BOUND and tree_bytes(tmp_path) <= BOUND
    assert all(size > 0 for size in held.values()), held  # each had room


def test_a_runner_that_opens_while_another_flushes_gets_the_bound_once_it_stops(tmp_path):
    stopping = opened(tmp_path, "ab")
    keep(stopping, 40)
    assert stopping.disk.drain(10)
    stopping.disk.flushing()  # as at its stop, before it writes its RAM tier
    starting = opened(tmp_path, "cd")
    assert 0 < starting.disk.budget < BOUND // 2  # half, while the other one is alive
    stopping.flush(10)
    stopping.close()
    assert wait_for(lambda: starting.disk.budget > BOUND // 2)  # then the whole bound
    keep(starting, 40)
    assert starting.disk.drain(10)
    assert on_disk(starting) > BOUND // 2 and tree_bytes(tmp_path) <= BOUND
    starting.close()


def test_a_runner_above_its_share_gives_room_to_one_that_opens_beside_it_and_asks(tmp_path):
    first = opened(tmp_path, "ab")
    keep(first, 40)
    assert first.disk.drain(10)
    assert on_disk(first) > BOUND * 3 // 4  # alone: the whole bound
    second = opened(tmp_path, "cd")
    keep(second, 20)  # refused while the tree is full: it wants its half
    assert second.disk.drain(10)
    assert wait_for(lambda: on_disk(first) <= BOUND // 2)  # the first trims its oldest
    keep(second, 20, start=20)
    assert second.disk.drain(10)
    assert on_disk(second) > BOUND // 4 and tree_bytes(tmp_path) <= BOUND
    # The last one spilled stayed (the very last is in RAM).
    newest = first.lookup("p", np.arange(38_000, 38_020, dtype=np.int32))
    assert newest is not None and newest.entry.on_disk
    first.close()
    second.close()


def test_a_runner_that_keeps_nothing_on_disk_takes_nothing_from_the_others(tmp_path):
    """An embedding model's runner, say: alive beside a chat model, it leaves it the bound."""
    quiet = opened(tmp_path, "cd")
    busy = opened(tmp_path, "ab")
    keep(busy, 40)
    assert busy.disk.drain(10)
    assert on_disk(busy) > BOUND * 3 // 4 and tree_bytes(tmp_path) <= BOUND
    busy.close()
    quiet.close()


def test_models_not_loaded_make_room_oldest_first(tmp_path):
    earlier = opened(tmp_path, "ab")
    keep(earlier, 40)
    earlier.flush(10)
    earlier.close()  # unloaded: its entries wait for its next load, within the bound
    idle = earlier.disk.directory
    oldest = min(idle.glob("*.kv"), key=lambda path: path.stat().st_mtime_ns)
    loaded = opened(tmp_path, "cd")
    keep(loaded, 10)
    assert loaded.disk.drain(10)
    assert on_disk(loaded) >= 9 * STATE and tree_bytes(tmp_path) <= BOUND
    assert not oldest.exists() and any(idle.glob("*.kv"))  # the oldest went, not all
    loaded.close()


def test_a_forget_done_where_no_runner_is_gives_its_bytes_back_in_the_ledger_at_once(tmp_path):
    """Not at the next open: the ledger says what the directory of a model not loaded takes
    as soon as a forget has deleted from it, and drops it once it is forgotten whole."""
    idle = opened(tmp_path, "ab")
    keep(idle, 10)
    idle.flush(10)
    idle.close()
    alive = opened(tmp_path, "cd")  # counts the directory of the model not loaded
    directory = idle.disk.directory
    name = directory.relative_to(tmp_path).as_posix()
    assert ledger_bytes(tmp_path)[name] == directory_bytes(directory) > 0
    keys = (model_layout("ab").model_key,)
    files.forget(tmp_path, forgets.record(tmp_path, partition="p", models=keys))
    assert not list(directory.glob("*.kv")) and ledger_bytes(tmp_path)[name] == 0
    keep(idle_again := opened(tmp_path, "ab"), 3)
    idle_again.flush(10)
    idle_again.close()
    files.forget(tmp_path, forgets.record(tmp_path, models=keys, everything=True))
    assert name not in ledger_bytes(tmp_path)
    alive.close()


def ledger_bytes(root) -> dict:
    return json.loads((root / LEDGER).read_text())["bytes"]


def test_leftovers_of_a_killed_write_are_swept_at_the_next_open_of_any_model(tmp_path):
    """A runner killed mid-write leaves a `.tmp` file in its directory: the next runner to open,
    of any model, removes it, and writes within what the bound then leaves."""
    layout = model_layout("ab")
    directory = tmp_path / layout.model_key / layout.digest
    directory.mkdir(parents=True)
    (directory / "0123.tmp").write_bytes(b"t" * (BOUND - 3 * STATE))
    store = opened(tmp_path, "cd")
    assert list(directory.glob("*.tmp")) == []
    keep(store, 20)
    assert store.disk.drain(10)
    assert on_disk(store) > BOUND // 2 and tree_bytes(tmp_path) <= BOUND
    store.close()


def test_a_write_that_finds_the_tree_full_is_refused_and_the_entry_dropped(tmp_path):
    """Two runners at their shares: the bound holds even for a write that races the other's
    (the store drops it, as when the disk is full), and nothing is left half-written."""
    first, second = opened(tmp_path, "ab"), opened(tmp_path, "cd")
    writers = [threading.Thread(target=keep, args=(store, 40)) for store in (first, second)]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(30)
    assert first.disk.drain(10) and second.disk.drain(10)
    assert tree_bytes(tmp_path) <= BOUND
    assert list(tmp_path.glob("*/*/*.tmp")) == []
    for store in (first, second):
        stats = store.stats()
        assert stats["disk"]["bytes"] <= stats["disk"]["bound"]
        store.close()


def test_workers_sharing_a_data_directory_share_its_bound(tmp_path):
    """Split mode's workers on one box keep prompts in directories of their own, under the data
    directory's: the bound is the box's, for them all."""
    stores = [PromptStore(STATE + 100, DiskTier(tmp_path / worker, model_layout("ab"), BOUND,
                                                box_root=tmp_path)).open()
              for worker in ("gpu-0", "gpu-1")]  # fmt: skip
    first, second = stores
    keep(first, 40)
    keep(second, 20)  # refused while the tree is full: it wants its half
    assert second.disk.drain(10)
    assert wait_for(lambda: on_disk(first) <= BOUND // 2)
    keep(second, 20, start=20)
    assert second.disk.drain(10)
    assert sum(directory_bytes(d) for d in tmp_path.glob("*/*/*")) <= BOUND
    assert on_disk(second) > BOUND // 4
    for store in stores:
        store.close()
