"""The prefix cache's bookkeeping: reuse within a partition, never across one."""

from inference.engine.prefix_cache import PrefixCache

HISTORY = list(range(1, 200))  # a conversation's KV: 199 tokens
PROMPT = HISTORY + [500, 501]  # its next turn


def cache_holding(partition: str | None, cache_key: str = "conv-a") -> PrefixCache:
    cache = PrefixCache(n_slots=2)
    slot, reused = cache.choose(HISTORY, cache_key, partition)
    cache.take(slot, reused, cache_key, partition)
    cache.release(slot.seq_id, HISTORY)
    return cache


def test_a_turn_reuses_the_kv_its_own_partition_left():
    cache = cache_holding("apikey:1")
    slot, reused = cache.choose(PROMPT, "conv-a", "apikey:1")
    assert reused == len(HISTORY)
    assert slot.tokens == HISTORY


def test_another_partition_reuses_nothing_even_with_the_same_prompt_and_conversation():
    cache = cache_holding("apikey:1")
    for cache_key in ("conv-a", "conv-b", None):
        slot, reused = cache.choose(PROMPT, cache_key, "apikey:2")
        assert reused == 0  # so its cached-token count tells it nothing about app 1
    slot, reused = cache.choose(PROMPT, "conv-a", "apikey:2")
    trim = cache.take(slot, reused, "conv-a", "apikey:2")
    if slot.seq_id == 0:  # it took app 1's slot: that KV is dropped before it runs
        assert trim is not None and trim.start == 0


def test_without_partitions_it_behaves_as_one_shared_cache():
    cache = cache_holding(None)
    _, reused = cache.choose(PROMPT, "conv-x", None)
    assert reused == len(HISTORY)
