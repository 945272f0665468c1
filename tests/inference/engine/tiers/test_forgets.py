"""The log of forgets: numbered in order, read back whole, kept short, and applied by a store
that opens a directory which has not applied them."""

import numpy as np
import pytest

from inference.engine.tiers import PromptStore, forgets
from inference.engine.tiers.disk import DiskTier

SHA = "ab" * 32


def test_forgets_are_numbered_in_order_and_a_line_cut_short_is_skipped(tmp_path):
    forgets.record(tmp_path, partition="apikey:1")
    forgets.record(tmp_path, models=[SHA], everything=True)
    with open(tmp_path / forgets.LOG_NAME, "ab") as log:
        log.write(b'{"seq": 3, "partit')  # a writer killed mid-line: its forget never answered
    assert [(f.seq, f.partition, f.models, f.everything) for f in forgets.read(tmp_path)] == [
        (1, "apikey:1", (), False), (2, None, (SHA,), True)]  # fmt: skip
    assert forgets.record(tmp_path, partition="apikey:3").seq == 3


def test_a_compacted_log_keeps_counting_from_its_latest(tmp_path):
    for n in range(3):
        forgets.record(tmp_path, partition=f"apikey:{n}")
    forgets.compact(tmp_path, 3)
    assert [f.seq for f in forgets.read(tmp_path)] == [3]
    assert forgets.record(tmp_path, partition="apikey:9").seq == 4


def test_forgetting_nobody_in_particular_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError):
        forgets.record(tmp_path)
    assert forgets.read(tmp_path) == []


def test_a_store_that_opens_a_directory_applies_the_forgets_it_missed(tmp_path, layout):
    store = PromptStore(1 << 20, DiskTier(tmp_path, layout, 1 << 30)).open()
    for n, partition in enumerate(["apikey:1", "apikey:2"]):
        store.put(partition, "c", list(range(100 * n, 100 * n + 20)), bytearray(b"s" * 64))
    store.flush(10)
    store.close()
    forgets.record(tmp_path, partition="apikey:1")  # nobody did it: the box was off
    again = PromptStore(1 << 20, DiskTier(tmp_path, layout, 1 << 30)).open()
    assert [e.partition for e in again.held()] == ["apikey:2"]
    assert again.lookup("apikey:1", np.arange(20, dtype=np.int32)) is None
    again.close()
