"""An entry file: written whole or not at all, and read back only when it is exactly what it
says it is (the layout, its size, its checksums)."""

import dataclasses
import fcntl
import os
import threading

import pytest

from inference.engine.tiers import files, framing

from .conftest import entry


def written(tmp_path, layout, tokens=range(40), data=b"state" * 100):
    kept = entry(list(tokens))
    files.write_entry(tmp_path, layout, kept, data)
    return kept, files.entry_path(tmp_path, kept.id)


def test_an_entry_reads_back_as_it_was_written(tmp_path, layout):
    kept, path = written(tmp_path, layout)
    header = files.read_header(path, layout)
    assert header.id == kept.id and header.partition == "apikey:1"
    assert header.cache_key == "conv-1" and list(header.tokens) == list(range(40))
    kept.n_bytes = header.payload_bytes
    assert files.read_payload(path, layout, kept) == bytearray(b"state" * 100)


@pytest.mark.parametrize(
    "setting", ["model", "file_mtime_ns", "kv_type", "flash_attn", "state_format"]
)
def test_an_entry_of_another_layout_is_refused(tmp_path, layout, setting):
    _, path = written(tmp_path, layout)
    value = getattr(layout, setting)
    changed = {str: lambda v: v + "x", bool: lambda v: not v, int: lambda v: v + 1}
    other = changed[type(value)](value)
    with pytest.raises(files.BadEntry, match="other load settings"):
        files.read_header(path, dataclasses.replace(layout, **{setting: other}))


@pytest.mark.parametrize("setting", ["ctx_per_seq", "n_gpu_layers"])
def test_an_entry_saved_with_another_context_or_offload_reads_back(tmp_path, layout, setting):
    kept, path = written(tmp_path, layout)
    other = dataclasses.replace(layout, **{setting: getattr(layout, setting) + 7})
    assert other.digest == layout.digest  # the same directory
    assert list(files.read_header(path, other).tokens) == list(range(40))


def test_a_header_that_is_json_but_not_an_object_is_refused(tmp_path, layout):
    header = b"[1, 2]"
    path = tmp_path / "list.kv"
    path.write_bytes(framing.frame(files.MAGIC, files.FORMAT, header))
    with pytest.raises(files.BadEntry, match="not an entry's"):
        files.read_header(path, layout)


def test_a_truncated_entry_is_refused(tmp_path, layout):
    _, path = written(tmp_path, layout)
    os.truncate(path, path.stat().st_size - 7)
    with pytest.raises(files.BadEntry, match="bytes where its header says"):
        files.read_header(path, layout)


def test_a_flipped_byte_in_the_payload_fails_its_checksum(tmp_path, layout):
    kept, path = written(tmp_path, layout)
    raw = bytearray(path.read_bytes())
    raw[-3] ^= 0xFF
    path.write_bytes(raw)
    kept.n_bytes = 500
    with pytest.raises(files.BadEntry, match="payload fails its checksum"):
        files.read_payload(path, layout, kept)


def test_a_flipped_byte_in_the_header_or_tokens_is_refused(tmp_path, layout):
    _, path = written(tmp_path, layout)
    original = path.read_bytes()
    for offset in (20, len(original) - 500 - 8):  # in the header's JSON; in the token ids
        raw = bytearray(original)
        raw[offset] ^= 0x01
        path.write_bytes(raw)
        with pytest.raises(files.BadEntry, match="checksum"):
            files.read_header(path, layout)


def test_garbage_and_missing_files_are_refused(tmp_path, layout):
    junk = tmp_path / "junk.kv"
    junk.write_bytes(b"not an entry at all, just bytes")
    with pytest.raises(files.BadEntry, match="not an entry"):
        files.read_header(junk, layout)
    with pytest.raises(files.BadEntry, match="gone"):
        files.read_header(tmp_path / "missing.kv", layout)


def test_a_replaced_entry_is_refused_at_read_even_with_a_sound_file(tmp_path, layout):
    kept, path = written(tmp_path, layout, tokens=range(40))
    kept.n_bytes = 500
    files.write_entry(tmp_path, layout, entry(list(range(41)), entry_id=kept.id), b"s" * 500)
    with pytest.raises(files.BadEntry, match="no longer holds"):
        files.read_payload(path, layout, kept)


def test_a_failed_write_leaves_nothing_behind(tmp_path, layout, monkeypatch):
    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(OSError, match="No space"):
        written(tmp_path, layout)
    assert list(tmp_path.iterdir()) == []


def test_a_directory_is_held_by_one_process_at_a_time(tmp_path):
    held = files.lock(tmp_path / "d")
    assert held is not None and files.is_locked(tmp_path / "d")
    assert files.lock(tmp_path / "d") is None
    held.close()
    assert not files.is_locked(tmp_path / "d")


def test_entries_are_readable_by_the_appliances_own_user_only(tmp_path, layout):
    _, path = written(tmp_path, layout)
    assert path.stat().st_mode & 0o777 == 0o600
    held = files.lock(tmp_path / "model" / "layout")
    assert (tmp_path / "model" / "layout").stat().st_mode & 0o777 == 0o700
    held.close()


def test_a_runner_taking_its_directory_while_a_probe_looks_at_it_takes_it(tmp_path):
    """A probe (is_locked, a forget, another runner's ledger) holds the directory's lock for a
    moment: a runner starting then waits it out instead of running without its disk tier."""
    directory = tmp_path / "d"
    directory.mkdir()
    probe = open(directory / files.LOCK_NAME, "a+b")  # noqa: SIM115
    fcntl.flock(probe, fcntl.LOCK_SH | fcntl.LOCK_NB)  # what is_locked holds for its moment
    assert not files.is_locked(directory)  # probes do not exclude each other
    taken = []
    starting = threading.Thread(target=lambda: taken.append(files.lock(directory)))
    starting.start()
    starting.join(0.05)
    probe.close()  # the probe is done
    starting.join(5)
    assert taken and taken[0] is not None
    assert files.is_locked(directory)
    taken[0].close()
