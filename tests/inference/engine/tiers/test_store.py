"""The two tiers' bookkeeping: what is kept, for whom, within which bounds."""

import threading

import numpy as np
import pytest

from inference.engine.tiers import PromptStore
from inference.engine.tiers.disk import DiskTier


def ids(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def state(n: int) -> bytearray:
    return bytearray(b"s" * n)


def disk_store(tmp_path, layout, ram: int, disk: int = 1 << 30) -> PromptStore:
    store = PromptStore(ram, DiskTier(tmp_path, layout, disk)).open()
    fetched = threading.Event()
    store.on_fetched = lambda result: fetched.set()
    store.fetched = fetched
    return store


def test_a_lookup_finds_the_longest_prefix_of_its_own_partition_only():
    store = PromptStore(1 << 20)
    store.put("apikey:1", "a", ids(40), state(100))
    store.put("apikey:1", "b", ids(30) + ids(50, 1000), state(100))
    prompt = np.asarray(ids(45), dtype=np.int32)
    hit = store.lookup("apikey:1", prompt)
    assert hit.shared == 40 and hit.entry.cache_key == "a"
    assert store.lookup("apikey:2", prompt) is None  # the same prompt, another app: nothing
    assert store.lookup(None, prompt) is None


def test_an_entry_that_a_kept_one_covers_is_not_kept_twice():
    store = PromptStore(1 << 20)
    first = store.put("p", "c", ids(40), state(100))
    assert store.put("p", "c", ids(30), state(100)) is None  # a prefix of what is kept
    longer = store.put("p", "c", ids(60), state(100))  # holds all of the first and more
    assert [e.id for e in store.held()] == [longer.id] and first.dropped
    assert store.covers("p", ids(50)) and not store.covers("q", ids(50))


def test_short_sequences_and_states_larger_than_the_bound_are_not_kept():
    store = PromptStore(1000)
    assert store.put("p", None, ids(5), state(100)) is None
    assert store.put("p", None, ids(40), state(1001)) is None
    assert store.held() == []


def test_the_ram_tier_never_holds_more_than_its_bound_without_a_disk():
    store = PromptStore(10_000)
    for n in range(50):
        store.put("p", f"c{n}", ids(20, 100 * n), state(1_500))
        assert store.ram_used <= 10_000
    assert store.ram_peak <= 10_000
    held = store.held()
    assert len(held) == 6 and store.counts["dropped"] == 44
    # The least recently used went first: the last six remain.
    assert sorted(e.cache_key for e in held) == sorted(f"c{n}" for n in range(44, 50))


def test_the_ram_tier_holds_its_bound_while_spilling_to_disk(tmp_path, layout):
    store = disk_store(tmp_path, layout, ram=10_000)
    for n in range(40):  # saves a step apart: what was written ahead leaves RAM at once
        store.put("p", f"c{n}", ids(20, 100 * n), state(1_500))
        assert store.ram_used <= 10_000
        assert store.disk.drain(10)
    assert store.disk.drain(10)
    stats = store.stats()
    assert stats["ram"]["peak"] <= 10_000 and stats["dropped"] == 0
    assert len(store.held()) == 40  # in RAM, on disk, or both (written ahead)
    assert len(list(store.disk.directory.glob("*.kv"))) == stats["disk"]["entries"]
    store.close()


def test_a_spilled_entry_comes_back_from_disk_whole(tmp_path, layout):
    store = disk_store(tmp_path, layout, ram=4_000)
    first = store.put("p", "first", ids(20), bytearray(b"first-state" * 100))
    for n in range(1, 4):  # push it out of RAM
        store.put("p", f"c{n}", ids(20, 100 * n), state(1_500))
    assert store.disk.drain(10)
    assert not first.in_ram and first.on_disk
    assert store.fetch(first)
    assert store.fetched.wait(10)
    assert first.in_ram and first.data == bytearray(b"first-state" * 100)
    assert store.ram_used <= 4_000
    store.close()


def test_the_disk_tier_holds_its_bound(tmp_path, layout):
    store = disk_store(tmp_path, layout, ram=2_000, disk=5_000)
    for n in range(20):
        store.put("p", f"c{n}", ids(20, 100 * n), state(1_000))
        assert store.disk_used <= 5_000
    assert store.disk.drain(10)
    on_disk = sum(f.stat().st_size - 1_000 for f in store.disk.directory.glob("*.kv"))
    assert store.stats()["disk"]["entries"] <= 5 and on_disk >= 0
    store.close()


def test_forgetting_a_partition_drops_it_from_both_tiers(tmp_path, layout):
    store = disk_store(tmp_path, layout, ram=3_000)
    for n in range(4):
        store.put("apikey:1", f"a{n}", ids(20, 100 * n), state(1_000))
        assert store.disk.drain(10)
        store.put("apikey:2", f"b{n}", ids(20, 100 * n), state(1_000))
        assert store.disk.drain(10)
    assert store.forget("apikey:1") == 4
    assert store.disk.drain(10)
    assert {e.partition for e in store.held()} == {"apikey:2"}
    assert store.lookup("apikey:1", np.asarray(ids(20), dtype=np.int32)) is None
    left = {store.disk.directory / f"{e.id}.kv" for e in store.held() if e.on_disk}
    assert set(store.disk.directory.glob("*.kv")) == left
    store.close()


def test_a_flush_writes_what_ram_holds_and_a_new_store_finds_it(tmp_path, layout):
    store = disk_store(tmp_path, layout, ram=1 << 20)
    for n in range(3):
        store.put("p", f"c{n}", ids(20, 100 * n), state(500))
    assert store.flush(10) == 3
    store.close()
    again = disk_store(tmp_path, layout, ram=1 << 20)
    hit = again.lookup("p", np.asarray(ids(25, 200), dtype=np.int32))
    assert hit.shared == 20 and hit.entry.cache_key == "c2" and not hit.entry.in_ram
    again.close()


def test_a_negative_bound_is_refused():
    with pytest.raises(ValueError):
        PromptStore(-1)


# --- defects found in review (issue 30) ----------------------------------------------------------


@pytest.mark.timeout(60)
def test_an_entry_on_disk_larger_than_the_ram_bound_is_no_candidate_and_evicts_nothing(
    tmp_path, layout
):
    first = disk_store(tmp_path, layout, ram=1 << 20)
    first.put("p", "big", ids(40), state(5_000))
    first.flush(10)
    first.close()
    store = disk_store(tmp_path, layout, ram=4_000)  # restarted with less RAM
    for n in range(3):
        store.put("p", f"c{n}", ids(20, 100 * (n + 1)), state(1_000))
    [big] = [e for e in store.held() if e.cache_key == "big"]
    assert store.lookup("p", np.asarray(ids(45), dtype=np.int32)) is None
    assert not store.fetch(big)  # never read into a RAM tier it cannot fit
    assert store.ram_used == 3_000 and big.on_disk and not big.in_ram
    store.close()


def test_the_bookkeeping_matches_what_is_held_through_saves_fetches_and_forgets(tmp_path, layout):
    import random

    rng = random.Random(3)
    store = disk_store(tmp_path, layout, ram=6_000, disk=20_000)
    for step in range(300):
        choice = rng.random()
        if choice < 0.5:
            n = rng.choice([500, 1_000, 2_000])
            if store.reserve(n):
                store.put(rng.choice("ab"), None, ids(20, 40 * step), state(n), reserved=n)
        elif choice < 0.85:
            on_disk = [e for e in store.held() if e.on_disk and not e.in_ram]
            if on_disk:
                store.fetch(rng.choice(on_disk))
        elif choice < 0.9:
            store.forget(rng.choice("ab"))
        elif choice < 0.95:
            assert store.disk.drain(10)
        assert store.ram_used <= 6_000
    assert store.disk.drain(10)
    held = store.held()
    assert store.ram_used == sum(e.n_bytes for e in held if e.in_ram)
    assert store.disk_used == sum(e.n_bytes for e in held if e.on_disk) <= 20_000
    assert {p.stem for p in store.disk.directory.glob("*.kv")} == {e.id for e in held if e.on_disk}
    assert store.ram_peak <= 6_000
    assert store.stats()["disk"]["entries"] == sum(e.on_disk for e in held)
    store.close()


def test_a_runner_keeps_nothing_in_ram_while_a_stopped_one_still_writes_its_own(
    tmp_path, layout, monkeypatch
):
    import dataclasses
    import time

    from inference.engine.tiers import files

    gate = threading.Event()
    write = files.write_entry
    monkeypatch.setattr(files, "write_entry", lambda *args: (gate.wait(10), write(*args))[1])
    stopping = disk_store(tmp_path, dataclasses.replace(layout, model="cd" * 32), ram=4_000)
    stopping.put("p", "c", ids(20), state(3_000))
    flush = threading.Thread(target=stopping.flush, args=(10,))
    flush.start()  # its write waits at the gate: its RAM tier is still held
    deadline = time.monotonic() + 5
    while files.marked(stopping.disk.directory) != "flushing" and time.monotonic() < deadline:
        time.sleep(0.01)
    starting = disk_store(tmp_path, layout, ram=4_000)  # another model, the same worker
    assert starting.put("p", "new", ids(20, 500), state(3_000)) is None
    assert starting.ram_used == 0
    gate.set()
    flush.join(10)
    stopping.close()
    deadline = time.monotonic() + 5
    while starting.put("p", "new", ids(20, 500), state(3_000)) is None:
        assert time.monotonic() < deadline, "the RAM tier never took its share"
        time.sleep(0.05)
    assert starting.ram_used == 3_000
    starting.close()
