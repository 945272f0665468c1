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


def busy_at(cache: PrefixCache, *seq_ids: int) -> None:
    for seq_id in seq_ids:
        cache.take(cache.slots[seq_id], 0, f"running-{seq_id}", "apikey:1")


def keeps_turn(cache: PrefixCache, seq_id: int, tokens: list[int], cache_key: str) -> None:
    slot = cache.slots[seq_id]
    cache.take(slot, 0, cache_key, "apikey:1")
    cache.release(seq_id, tokens)


def test_a_new_conversation_fills_the_gap_in_the_busy_ids_before_taking_an_empty_slot():
    # One KV stream per sequence: llama.cpp runs each run of consecutive ids as a pass of its
    # own, so a gap among the busy ids costs every step.
    cache = PrefixCache(n_slots=5)
    keeps_turn(cache, 2, [900, 901, 902], "old-conversation")
    busy_at(cache, 0, 1, 3)
    slot, reused = cache.choose(PROMPT, "conv-new", "apikey:1")
    assert (slot.seq_id, reused) == (2, 0)  # not slot 4, empty, beside the busy ones


def test_a_conversation_still_comes_back_to_its_own_history_across_a_gap():
    cache = PrefixCache(n_slots=5)
    keeps_turn(cache, 4, HISTORY, "conv-a")
    busy_at(cache, 0, 2)
    slot, reused = cache.choose(PROMPT, "conv-a", "apikey:1")
    assert (slot.seq_id, reused) == (4, len(HISTORY))


def test_a_short_history_of_its_own_still_outweighs_a_gap():
    short = list(range(1, 31))  # a first turn of 30 tokens, less than a run's price
    cache = PrefixCache(n_slots=5)
    keeps_turn(cache, 4, short, "conv-a")
    busy_at(cache, 0, 1, 3)
    slot, reused = cache.choose(short + [500, 501], "conv-a", "apikey:1")
    assert (slot.seq_id, reused) == (4, len(short))


def test_a_few_shared_template_tokens_do_not_outweigh_a_gap():
    template = list(range(1, 21))  # a chat template's first tokens, which every prompt shares
    cache = PrefixCache(n_slots=5)
    keeps_turn(cache, 4, template + [700, 701, 702, 703], "another-conversation")
    busy_at(cache, 0, 1, 3)  # slot 2 fills the gap; slot 4 keeps the busy ids in one run
    slot, reused = cache.choose(template + [800, 801], "conv-new", "apikey:1")
    assert (slot.seq_id, reused) == (2, 0)


def test_a_second_request_takes_the_first_ones_neighbour_before_an_empty_slot_apart():
    cache = PrefixCache(n_slots=4)
    keeps_turn(cache, 1, [900, 901, 902], "old-conversation")
    first, _ = cache.choose(PROMPT, "conv-1", "apikey:1")
    cache.take(first, 0, "conv-1", "apikey:1")
    second, _ = cache.choose(PROMPT, "conv-2", "apikey:1")
    assert (first.seq_id, second.seq_id) == (0, 1)  # slot 1's kept turn gives way


def test_a_kept_prefix_is_restored_where_it_fills_a_gap():
    cache = PrefixCache(n_slots=5)
    keeps_turn(cache, 2, [900, 901, 902], "old-conversation")
    busy_at(cache, 0, 1, 3)
    assert cache.choose_empty().seq_id == 2  # not slot 4, empty
