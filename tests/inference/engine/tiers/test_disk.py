"""The disk tier at open and under faults: a killed runner's leftovers, entries of other settings,
a directory another runner holds, a full disk, files deleted or corrupted behind its back."""

import dataclasses
import errno
import logging
import threading
import time

import numpy as np

from inference.engine.tiers import PromptStore, files, forgets, framing
from inference.engine.tiers.disk import DiskTier

from .conftest import entry


def ids(n: int, start: int = 0) -> np.ndarray:
    return np.arange(start, start + n, dtype=np.int32)


def spilled(tmp_path, layout, count: int = 3) -> list:
    """Entries written by a store that then stopped (its flush)."""
    store = PromptStore(1 << 20, DiskTier(tmp_path, layout, 1 << 30)).open()
    kept = [store.put("p", f"c{n}", list(ids(20, 100 * n)), bytearray(b"x" * 500))
            for n in range(count)]  # fmt: skip
    store.flush(10)
    store.close()
    return kept


def opened(tmp_path, layout, ram: int = 1 << 20) -> PromptStore:
    store = PromptStore(ram, DiskTier(tmp_path, layout, 1 << 30)).open()
    store.fetched = threading.Event()
    store.on_fetched = lambda result: store.fetched.set()
    return store


def test_open_indexes_what_a_stopped_runner_left(tmp_path, layout):
    kept = spilled(tmp_path, layout)
    store = opened(tmp_path, layout)
    assert {e.id for e in store.held()} == {e.id for e in kept}
    assert all(e.on_disk and not e.in_ram for e in store.held())
    store.close()


def test_open_removes_leftovers_and_corrupt_entries_with_a_log_line(tmp_path, layout, caplog):
    kept = spilled(tmp_path, layout)
    directory = tmp_path / layout.model_key / layout.digest
    (directory / "half-written.tmp").write_bytes(b"partial")
    broken = files.entry_path(directory, kept[0].id)
    broken.write_bytes(broken.read_bytes()[:-10])  # truncated
    with caplog.at_level(logging.WARNING):
        store = opened(tmp_path, layout)
    assert {e.id for e in store.held()} == {kept[1].id, kept[2].id}
    assert not broken.exists() and not (directory / "half-written.tmp").exists()
    assert "deleting kept prompt" in caplog.text
    store.close()


def test_a_reload_with_another_context_or_offload_finds_what_it_kept(tmp_path, layout):
    """The preflight and a client's num_ctx reload a model with another context, a smaller GPU
    another offload: its kept prompts are still there."""
    kept = spilled(tmp_path, layout)
    reloaded = dataclasses.replace(layout, ctx_per_seq=4096, n_gpu_layers=0)
    store = opened(tmp_path, reloaded)
    assert {e.id for e in store.held()} == {e.id for e in kept}
    assert store.stats()["disk"]["note"] == ""
    store.close()


def test_entries_longer_than_a_smaller_context_are_dropped_and_said(tmp_path, layout):
    store = PromptStore(1 << 20, DiskTier(tmp_path, layout, 1 << 30)).open()
    short = store.put("p", "short", list(ids(20)), bytearray(b"s" * 500))
    store.put("p", "long", list(ids(200, 1000)), bytearray(b"l" * 500))
    store.put("p", "longer", list(ids(250, 2000)), bytearray(b"m" * 500))
    store.flush(10)
    store.close()
    smaller = opened(tmp_path, dataclasses.replace(layout, ctx_per_seq=128))
    assert [e.id for e in smaller.held()] == [short.id]
    assert smaller.stats()["disk"]["note"] == (
        "dropped 2 entries: longer than this load's context (128 tokens)")  # fmt: skip
    smaller.close()


def test_entries_of_other_load_settings_wait_on_disk_for_them(tmp_path, layout):
    """Another KV type cannot restore them: they stay in their own directory, within the
    bound, and are there again when the settings come back."""
    kept = spilled(tmp_path, layout)
    other = dataclasses.replace(layout, kv_type="q8_0")
    store = opened(tmp_path, other)
    assert store.held() == []
    store.close()
    assert {p.name for p in (tmp_path / layout.model_key).iterdir()} == {
        layout.digest, other.digest}  # fmt: skip
    back = opened(tmp_path, layout)
    assert {e.id for e in back.held()} == {e.id for e in kept}
    back.close()


def test_entries_from_before_layouts_were_named_by_their_key_are_taken_over(tmp_path, layout):
    """Before, a directory's name said the context and offload too: what such a directory
    holds for this model, KV type and format is found by the next load."""
    earlier = dataclasses.replace(layout, ctx_per_seq=512)
    kept = spilled(tmp_path, earlier)
    named_before = tmp_path / layout.model_key / "0123456789abcdef"  # another digest
    (tmp_path / layout.model_key / layout.digest).rename(named_before)
    other_kv = spilled(tmp_path, dataclasses.replace(layout, kv_type="q8_0"))
    store = opened(tmp_path, layout)
    assert {e.id for e in store.held()} == {e.id for e in kept}
    assert not list(named_before.glob("*.kv"))
    assert all(e.id not in {h.id for h in store.held()} for e in other_kv)  # left in its own
    store.close()


def test_an_entry_a_recorded_forget_covers_is_not_taken_over_from_a_directory_named_before(
    tmp_path, layout
):
    """The directory named before had not applied a forget that this layout's directory had:
    its entries of the forgotten partition are deleted there, not moved here, where nothing
    would apply that forget again."""
    earlier = dataclasses.replace(layout, ctx_per_seq=512)
    before = PromptStore(1 << 20, DiskTier(tmp_path, earlier, 1 << 30)).open()
    for n, partition in enumerate(["apikey:1", "apikey:2"]):
        before.put(partition, "c", list(ids(20, 100 * n)), bytearray(b"x" * 500))
    before.flush(10)
    before.close()
    named_before = tmp_path / layout.model_key / "0123456789abcdef"
    (tmp_path / layout.model_key / layout.digest).rename(named_before)
    forget = forgets.record(tmp_path, partition="apikey:1")
    directory = tmp_path / layout.model_key / layout.digest
    directory.mkdir()
    forgets.mark_applied(directory, forget.seq)  # this one did it (its runner was serving)
    store = opened(tmp_path, layout)
    assert [e.partition for e in store.held()] == ["apikey:2"]
    assert not list(named_before.glob("*.kv")) and len(list(directory.glob("*.kv"))) == 1
    store.close()


def test_a_model_file_replaced_under_the_same_name_finds_nothing(tmp_path, layout):
    spilled(tmp_path, layout)
    replaced = dataclasses.replace(layout, file_size=layout.file_size + 1, file_mtime_ns=99)
    store = opened(tmp_path, replaced)
    assert store.held() == []
    store.close()


def test_a_directory_another_runner_holds_leaves_ram_only(tmp_path, layout, caplog):
    first = opened(tmp_path, layout)
    with caplog.at_level(logging.WARNING):
        second = opened(tmp_path, layout)
    assert first.disk is not None and second.disk is None
    assert "another runner holds" in caplog.text
    assert second.put("p", "c", list(ids(20)), bytearray(b"y" * 100)) is not None  # RAM works
    first.close()
    second.close()


def test_a_full_disk_while_spilling_drops_the_entry_with_a_log_line(
    tmp_path, layout, monkeypatch, caplog
):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files, "write_entry", full)
    store = opened(tmp_path, layout, ram=1_000)
    with caplog.at_level(logging.WARNING):
        for n in range(4):  # saves a step apart: each write is over before the next save
            store.put("p", f"c{n}", list(ids(20, 100 * n)), bytearray(b"z" * 400))
            assert store.disk.drain(10)
    stats = store.stats()
    assert stats["spill_failed"] >= 2 and stats["disk"]["bytes"] == 0
    assert stats["ram"]["bytes"] <= 1_000
    assert "could not spill" in caplog.text and "No space left" in caplog.text
    assert list((tmp_path / layout.model_key / layout.digest).glob("*.kv")) == []
    store.close()


def test_an_entry_deleted_behind_its_back_is_dropped_at_fetch(tmp_path, layout, caplog):
    kept = spilled(tmp_path, layout)
    store = opened(tmp_path, layout)
    gone = next(e for e in store.held() if e.id == kept[0].id)
    files.entry_path(store.disk.directory, gone.id).unlink()
    with caplog.at_level(logging.WARNING):
        assert store.fetch(gone)
        assert store.fetched.wait(10)
    assert gone.dropped and store.counts["unreadable"] == 1
    assert "is unusable (it is gone)" in caplog.text
    store.close()


def test_an_entry_corrupted_behind_its_back_is_never_handed_over(tmp_path, layout, caplog):
    kept = spilled(tmp_path, layout)
    store = opened(tmp_path, layout)
    bad = next(e for e in store.held() if e.id == kept[1].id)
    path = files.entry_path(store.disk.directory, bad.id)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0x55
    path.write_bytes(raw)
    with caplog.at_level(logging.WARNING):
        store.fetch(bad)
        assert store.fetched.wait(10)
    assert bad.data is None and bad.dropped and not path.exists()
    assert "fails its checksum" in caplog.text
    store.close()


def test_a_header_that_is_json_but_not_an_object_is_deleted_and_the_rest_indexed(
    tmp_path, layout, caplog
):
    kept = spilled(tmp_path, layout)
    directory = tmp_path / layout.model_key / layout.digest
    header = b'"a string"'
    (directory / "odd.kv").write_bytes(framing.frame(files.MAGIC, files.FORMAT, header))
    with caplog.at_level(logging.WARNING):
        store = opened(tmp_path, layout)
    assert store.disk is not None and {e.id for e in store.held()} == {e.id for e in kept}
    assert not (directory / "odd.kv").exists() and "not an entry's" in caplog.text
    assert store.stats()["disk"]["note"] == "dropped 1 entry: damaged or unreadable"
    store.close()


def unusable(directory):
    """A directory under the root that this process cannot use, as another user's is for the
    appliance's user: its lock cannot be opened. (Run as root, permissions would not stop
    this process, so its lock is made a directory, which fails the same open.)"""
    (directory / files.LOCK_NAME).mkdir(parents=True)
    (directory / "theirs.kv").write_bytes(b"x" * 100)
    return directory


def test_a_directory_under_the_root_it_cannot_use_is_left_alone_with_a_log_line(
    tmp_path, layout, caplog
):
    other = dataclasses.replace(layout, kv_type="q4_0")
    foreign = unusable(tmp_path / layout.model_key / other.digest)
    elsewhere = unusable(tmp_path / ("ef" * 32) / "0123456789abcdef")
    with caplog.at_level(logging.WARNING):
        store = PromptStore(1 << 20, DiskTier(tmp_path, layout, 1_000_000)).open()
    assert store.disk is not None  # its own directory is used
    assert "not this appliance's to use" in caplog.text
    for n in range(3):
        store.put("p", f"c{n}", list(ids(20, 100 * n)), bytearray(b"y" * 500))
    store.flush(10)
    assert len(list(store.disk.directory.glob("*.kv"))) == 3
    assert (foreign / "theirs.kv").exists() and (elsewhere / "theirs.kv").exists()
    store.close()


def test_entry_files_written_for_another_entry_id_are_removed(tmp_path, layout):
    directory = tmp_path / layout.model_key / layout.digest
    directory.mkdir(parents=True)
    files.write_entry(directory, layout, entry(list(range(20)), entry_id="real"), b"q" * 10)
    (directory / "real.kv").rename(directory / "alias.kv")
    store = opened(tmp_path, layout)
    assert store.held() == [] and not (directory / "alias.kv").exists()
    store.close()


def test_a_runner_started_while_the_last_one_writes_to_disk_takes_its_directory_over(
    tmp_path, layout
):
    stopping = opened(tmp_path, layout)
    stopping.put("p", "c", list(ids(20)), bytearray(b"w" * 300))
    stopping.disk.flushing()  # as flush() says at a stop, before it writes
    starting = opened(tmp_path, layout)
    assert starting.disk is None  # RAM only, for now
    stopping.flush(10)
    stopping.close()
    deadline = time.monotonic() + 5
    while starting.disk is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert starting.disk is not None
    hit = starting.lookup("p", ids(25))
    assert hit is not None and hit.shared == 20 and hit.entry.on_disk
    starting.close()
