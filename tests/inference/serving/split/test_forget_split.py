"""Forgetting kept prompts in split mode: every worker forgets what it keeps of a partition on
its own box, and a box that was off when the forget was broadcast does it when it is back.

What a worker keeps is read where it keeps it: the entry files under its data directory, once
its runner has stopped and written its RAM tier (a warm stop)."""

import pytest

from inference.engine import GenerationRequest, SamplingParams
from inference.engine.tiers import files
from inference.serving import split_protocol as protocol
from tests.split.streams import chat_prompt, collect, eventually

pytestmark = [pytest.mark.redis, pytest.mark.model]

MINE, THEIRS = "apikey:7", "apikey:8"


def kept(partition: str) -> GenerationRequest:
    """A request whose prompt is long enough to be kept, in `partition`."""
    text = f"For {partition}: the kitchen light, the hall light, the heating and the front door."
    params = SamplingParams(max_tokens=4, temperature=0.0)
    return GenerationRequest(chat_prompt(text), params, model="smollm2-135m-instruct",
                             cache_key=f"conversation of {partition}",
                             cache_partition=partition)  # fmt: skip


def kept_partitions(worker) -> list[str] | None:
    """The partitions of the entry files on the worker's box, sorted; None while a runner
    still holds a directory (it may be writing)."""
    root = worker.workdir / f"{worker.label}-data" / "kv-cache"
    layouts = [d for d in root.glob("*/*/*") if d.is_dir()]
    if any(files.is_locked(d) for d in layouts):
        return None
    return sorted(files._header_of(p)["partition"] for p in root.glob(f"*/*/*/*{files.SUFFIX}"))


async def test_a_forget_reaches_the_workers_and_what_they_keep_of_the_partition_goes(
    split_client, spec, start_worker
):
    worker = start_worker()
    for partition in (MINE, THEIRS):
        assert (await collect(split_client, kept(partition), spec))[-1]["type"] == "done"
    await split_client.forget_prompts(partition=MINE)
    worker.stop()  # its runner writes what its slots and RAM keep to disk
    assert await eventually(lambda: kept_partitions(worker) == [THEIRS])


async def test_a_box_that_was_off_during_a_forget_does_it_when_it_is_back(
    split_client, spec, start_worker
):
    worker = start_worker()
    for partition in (MINE, THEIRS):
        assert (await collect(split_client, kept(partition), spec))[-1]["type"] == "done"
    worker.stop()
    assert await eventually(lambda: kept_partitions(worker) == [MINE, THEIRS])
    assert await split_client.forget_prompts(partition=MINE) == 0  # nobody heard it
    worker.start().wait_until_alive()
    assert await eventually(lambda: kept_partitions(worker) == [THEIRS], timeout=120)


def test_the_latest_forgets_are_kept_numbered_in_order(split_redis, monkeypatch):
    monkeypatch.setattr(protocol, "MAX_FORGETS", 2)
    numbers = [protocol.keep_forget(split_redis, {"op": "forget", "partition": f"apikey:{n}"})
               for n in range(3)]  # fmt: skip
    assert numbers == [numbers[0], numbers[0] + 1, numbers[0] + 2]
    assert [(c["n"], c["partition"]) for c in protocol.kept_forgets(split_redis)] == [
        (numbers[1], "apikey:1"), (numbers[2], "apikey:2")]  # fmt: skip
