"""Encoded images in the disk tier: read back only as written, within the box's disk bound and
their share of it, and forgotten with their partition's kept prompts."""

import json
import threading

import numpy as np
import pytest

from inference.engine.tiers import PromptStore, files, forgets, images
from inference.engine.tiers.disk import DiskTier
from inference.engine.tiers.ledger import LEDGER
from tests.inference.engine.tiers.runners import STATE, keep, model_layout, opened, wait_for

ROWS, COLS = 64, 32  # an image of 64 positions, 8 KB on disk


def key(n: int) -> str:
    return f"{n:064x}"


def rows(n: int) -> np.ndarray:
    return np.random.default_rng(n).standard_normal((ROWS, COLS)).astype(np.float32)


def image_files(root) -> list:
    return sorted(root.rglob(f"*{images.SUFFIX}"))


def tree_bytes(root) -> int:
    """What every entry, image and temporary file of the tree takes now."""
    return sum(path.stat().st_size for path in root.rglob("*")
               if path.suffix in (files.SUFFIX, images.SUFFIX, files.TEMPORARY))  # fmt: skip


def vision_store(root, model: str = "ab", bound: int = 1 << 30, share: float = 0.25):
    return PromptStore(STATE + 100, DiskTier(root, model_layout(model), bound,
                                             image_share=share)).open()  # fmt: skip


def shelve(store: PromptStore, partition: str, n: int) -> None:
    store.write_image(partition, key(n), rows(n))
    assert store.disk.drain(10)


# --- the file ----------------------------------------------------------------------------------


def test_an_image_reads_back_as_it_was_written(tmp_path):
    path = images.image_path(tmp_path, "apikey:1", key(1))
    size = images.write(path, key(1), rows(1))
    assert size == path.stat().st_size <= images.file_size(key(1), rows(1))
    assert np.array_equal(images.read(path, key(1), ROWS, COLS), rows(1))
    assert path.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("wanted", [(key(2), ROWS, COLS), (key(1), ROWS - 1, COLS),
                                    (key(1), ROWS, COLS + 1)])  # fmt: skip
def test_an_image_of_another_key_or_shape_is_refused(tmp_path, wanted):
    path = images.image_path(tmp_path, None, key(1))
    images.write(path, key(1), rows(1))
    with pytest.raises(images.BadImage):
        images.read(path, *wanted)


@pytest.mark.parametrize("where", ["header", "rows", "truncated", "garbage"])
def test_a_damaged_image_file_is_refused(tmp_path, where):
    path = images.image_path(tmp_path, None, key(1))
    images.write(path, key(1), rows(1))
    data = bytearray(path.read_bytes())
    if where == "header":
        data[20] ^= 0xFF
    elif where == "rows":
        data[-5] ^= 0x01
    elif where == "truncated":
        data = data[:-4]
    else:
        data = bytearray(b"not an image at all")
    path.write_bytes(bytes(data))
    with pytest.raises(images.BadImage):
        images.read(path, key(1), ROWS, COLS)


def test_partitions_keep_their_images_apart_under_names_that_do_not_say_theirs(tmp_path):
    one = images.image_path(tmp_path, "apikey:1", key(1))
    other = images.image_path(tmp_path, "apikey:2", key(1))
    assert one.parent != other.parent and "apikey" not in str(one)
    with pytest.raises(ValueError):
        images.image_path(tmp_path, None, "../../etc/passwd")


# --- the disk tier -----------------------------------------------------------------------------


def test_the_disk_tier_writes_an_image_on_its_thread_and_the_next_load_reads_it(
    tmp_path, monkeypatch
):
    store = vision_store(tmp_path)
    writer = []
    real_write = images.write
    monkeypatch.setattr(images, "write", lambda *args: writer.append(
        threading.current_thread().name) or real_write(*args))  # fmt: skip
    shelve(store, "apikey:1", 1)
    assert writer == ["kv-disk"]
    store.flush(10)
    store.close()
    again = vision_store(tmp_path)
    assert np.array_equal(again.read_image("apikey:1", key(1), ROWS, COLS), rows(1))
    assert again.read_image("apikey:2", key(1), ROWS, COLS) is None  # another partition's
    again.close()


def test_a_text_model_keeps_no_images(tmp_path):
    store = vision_store(tmp_path, share=0.0)
    store.write_image("p", key(1), rows(1))
    assert store.disk.drain(10) and image_files(tmp_path) == []
    store.close()


def test_a_damaged_image_on_disk_is_deleted_and_not_handed_over(tmp_path, caplog):
    store = vision_store(tmp_path)
    shelve(store, "p", 1)
    (path,) = image_files(tmp_path)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    assert store.read_image("p", key(1), ROWS, COLS) is None
    assert store.disk.drain(10) and not path.exists()
    assert "encoded image" in caplog.text
    shelve(store, "p", 1)  # encoded again, kept again
    assert np.array_equal(store.read_image("p", key(1), ROWS, COLS), rows(1))
    store.close()


def test_images_count_in_the_ledger_and_hold_their_share_of_the_bound_oldest_out_first(tmp_path):
    bound = 120_000  # room for a few images beside the kept prompts
    store = vision_store(tmp_path, bound=bound)
    room = int(bound * 0.25)
    for n in range(12):
        shelve(store, "p", n)
        assert sum(p.stat().st_size for p in image_files(tmp_path)) <= room
    kept = {path.stem for path in image_files(tmp_path)}
    one = images.file_size(key(0), rows(0))
    assert key(11) in kept and key(0) not in kept and len(kept) == room // one
    keep(store, 60)  # kept prompts beside them, past the bound: they make room in their share
    assert store.disk.drain(10)
    directory = store.disk.directory.relative_to(tmp_path).as_posix()
    ledger = json.loads((tmp_path / LEDGER).read_text())["bytes"]
    assert ledger[directory] == tree_bytes(tmp_path) <= bound
    assert {path.stem for path in image_files(tmp_path)} == kept
    store.flush(10)
    store.close()
    assert tree_bytes(tmp_path) <= bound


def test_images_past_their_room_go_oldest_first_when_a_runner_beside_asks_for_its_half(tmp_path):
    bound = 120_000
    store = vision_store(tmp_path, bound=bound, share=0.5)
    for n in range(6):
        shelve(store, "p", n)
    keep(store, 40)  # alone: the whole bound, half of it images
    assert store.disk.drain(10) and tree_bytes(tmp_path) > bound * 3 // 4
    beside = opened(tmp_path, "cd", bound=bound)
    keep(beside, 20)  # refused while the tree is full: it wants its half
    assert beside.disk.drain(10)

    def images_held() -> int:
        return sum(path.stat().st_size for path in image_files(store.disk.directory))

    assert wait_for(lambda: images_held() <= bound // 2 * 0.5)  # half of its half now
    assert key(5) in {path.stem for path in image_files(tmp_path)}
    assert tree_bytes(tmp_path) <= bound
    beside.close()
    store.close()


def test_the_images_of_a_model_not_loaded_make_room_for_another_within_the_bound(tmp_path):
    bound = 60_000
    idle = vision_store(tmp_path, "ab", bound=bound, share=0.5)
    for n in range(3):
        shelve(idle, "p", n)
    assert len(image_files(tmp_path)) == 3
    idle.flush(10)
    idle.close()
    loaded = opened(tmp_path, "cd", bound=bound)
    keep(loaded, 30)
    assert loaded.disk.drain(10)
    assert tree_bytes(tmp_path) <= bound and len(image_files(tmp_path)) < 3
    loaded.close()


# --- forgets -----------------------------------------------------------------------------------


def test_forgetting_a_partition_deletes_its_images_and_no_others(tmp_path):
    store = vision_store(tmp_path)
    shelve(store, "apikey:1", 1)
    shelve(store, "apikey:2", 2)
    store.forget("apikey:1")
    assert store.disk.drain(10)
    assert store.read_image("apikey:1", key(1), ROWS, COLS) is None
    assert [path.stem for path in image_files(tmp_path)] == [key(2)]
    store.close()


def test_a_recorded_forget_deletes_the_images_of_a_model_not_loaded_and_gives_back_their_bytes(
    tmp_path,
):
    store = vision_store(tmp_path)
    shelve(store, "apikey:1", 1)
    shelve(store, "apikey:2", 2)
    store.flush(10)
    store.close()
    directory = store.disk.directory
    record = forgets.record(tmp_path, partition="apikey:1")
    assert files.forget(tmp_path, record) == 1
    assert [path.stem for path in image_files(tmp_path)] == [key(2)]
    name = directory.relative_to(tmp_path).as_posix()
    assert json.loads((tmp_path / LEDGER).read_text())["bytes"][name] == tree_bytes(tmp_path)
    files.forget(tmp_path, forgets.record(tmp_path, everything=True))
    assert image_files(tmp_path) == []


def test_a_forget_recorded_while_the_runner_was_off_is_done_when_it_opens(tmp_path):
    store = vision_store(tmp_path)
    shelve(store, "apikey:1", 1)
    store.flush(10)
    store.close()
    held = files.lock(store.disk.directory)  # as if a runner held it: the record alone is made
    forgets.record(tmp_path, partition="apikey:1")
    held.close()
    again = vision_store(tmp_path)
    assert image_files(tmp_path) == []
    assert again.read_image("apikey:1", key(1), ROWS, COLS) is None
    again.close()


def test_a_queued_image_write_that_a_newer_forget_covers_is_dropped(tmp_path, monkeypatch):
    store = vision_store(tmp_path)
    go = threading.Event()
    real_write = images.write

    def held_write(*args):  # the first write waits: the next one queues behind it
        go.wait(10)
        return real_write(*args)

    monkeypatch.setattr(images, "write", held_write)
    store.write_image("apikey:2", key(2), rows(2))
    store.write_image("apikey:1", key(1), rows(1))  # queued, then forgotten
    forgets.record(tmp_path, partition="apikey:1")
    go.set()
    assert store.disk.drain(10)
    assert [path.stem for path in image_files(tmp_path)] == [key(2)]
    store.close()
