"""Sequence slots of the llama.cpp context, and the KV prefixes that finished turns leave behind.

The context holds `n_slots` sequence ids. A slot is busy (a running request owns it), cached (it
holds the KV of a finished turn, tagged with its tokens and conversation), or empty. A new request
takes the idle slot whose tokens share the longest prefix with its prompt, so the next turn of a
conversation only prefills what is new; cached slots are evicted least-recently-used. A slot's
KV is reused only within its partition (an app's key, a user): another partition's slot is
unrelated to the prompt, whatever it holds, so neither its text nor its length can be learnt.

This module only does bookkeeping: it returns the KV edits (`KvTrim`) that the runner must apply.
"""

from dataclasses import dataclass, field


@dataclass(slots=True, frozen=True)
class KvTrim:
    """Remove a sequence's KV from position `start` to the end (0: all of it)."""

    seq_id: int
    start: int


@dataclass(slots=True)
class Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # what this slot's KV holds when idle
    cache_key: str | None = None
    partition: str | None = None  # whose KV it holds
    last_used: int = 0
    busy: bool = False


# Like llama-server's slot similarity: reuse another conversation's slot only when at least
# half of what it holds is a prefix of the new prompt.
MIN_REUSE_FRACTION = 0.5


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PrefixCache:
    def __init__(self, n_slots: int, enabled: bool = True):
        if n_slots < 1:
            raise ValueError("at least one sequence slot is needed")
        self.slots = [Slot(seq_id=i) for i in range(n_slots)]
        self.enabled = enabled
        self._clock = 0  # a use counter: LRU order without wall-clock reads

    @property
    def idle_tokens(self) -> int:
        """KV cells held by idle cached slots: reclaimable, but occupied."""
        return sum(len(s.tokens) for s in self.slots if not s.busy)

    @property
    def busy_count(self) -> int:
        return sum(s.busy for s in self.slots)

    def has_free_slot(self) -> bool:
        return any(not s.busy for s in self.slots)

    def choose(
        self, prompt_ids: list[int], cache_key: str | None, partition: str | None = None
    ) -> tuple[Slot, int]:
        """The idle slot to run this prompt in, and how many prompt tokens it already holds.

        At least one prompt token is always left to compute, since sampling needs its logits.
        """
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            raise RuntimeError("no idle slot")

        def preference(slot: Slot) -> tuple:
            ours = slot.partition == partition or not slot.tokens
            shared = common_prefix(slot.tokens, prompt_ids) if self.enabled and ours else 0
            same_conversation = ours and cache_key is not None and slot.cache_key == cache_key
            if not same_conversation and shared < MIN_REUSE_FRACTION * len(slot.tokens):
                # A BOS token or a common system prompt is not worth another conversation's
                # cache: such a slot counts as unrelated (empty or least recently used wins).
                shared = 0
            # Longest shared prefix first, then the same conversation, then an empty slot,
            # then the least recently used one (the cheapest to give up).
            return (shared, same_conversation, not slot.tokens, -slot.last_used)

        best = max(idle, key=preference)
        shared = preference(best)[0]
        return best, min(shared, len(prompt_ids) - 1)

    def take(
        self, slot: Slot, reused: int, cache_key: str | None, partition: str | None = None
    ) -> KvTrim | None:
        """Mark `slot` busy, keeping only its first `reused` tokens of KV."""
        trim = KvTrim(slot.seq_id, reused) if len(slot.tokens) > reused else None
        slot.busy = True
        slot.tokens = []
        slot.cache_key = cache_key
        slot.partition = partition
        return trim

    def evict_one(self, keep: Slot) -> KvTrim | None:
        """Drop the least recently used idle cached slot other than `keep`, if any."""
        candidates = [s for s in self.slots if not s.busy and s.tokens and s is not keep]
        if not candidates:
            return None
        victim = min(candidates, key=lambda s: s.last_used)
        victim.tokens = []
        victim.cache_key = None
        return KvTrim(victim.seq_id, 0)

    def release(self, seq_id: int, kv_tokens: list[int] | None) -> KvTrim | None:
        """A request left its slot. `kv_tokens` is the KV to keep for the next turn, or None to
        drop it (cancelled or failed requests, or with the cache disabled)."""
        slot = self.slots[seq_id]
        slot.busy = False
        self._clock += 1
        slot.last_used = self._clock
        if kv_tokens is None or not self.enabled:
            slot.tokens = []
            slot.cache_key = None
            return KvTrim(seq_id, 0)
        slot.tokens = kv_tokens
        return None
