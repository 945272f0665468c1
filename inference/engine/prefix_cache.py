"""Sequence slots of the llama.cpp context, and the KV prefixes that finished turns leave behind.

The context holds `n_slots` sequence ids. A slot is busy (a running request owns it), cached (it
holds the KV of a finished turn, tagged with its tokens and conversation), or empty. A new request
takes the idle slot whose tokens share the longest prefix with its prompt, so the next turn of a
conversation only prefills what is new; where no slot holds the conversation and another saves
little, the slot that keeps the busy sequence ids together (`added_runs`: each run of them is a
graph pass of its own in every step); cached slots are evicted least-recently-used. A slot's
KV is reused only within its partition (an app's key, a user): another partition's slot is
unrelated to the prompt, whatever it holds, so neither its text nor its length can be learnt.

With warm memory on (`keeps_dropped`), KV a slot holds is not lost when the slot is needed for
something else: the edit that drops it is preceded by a `KvSave`, which the engine turns into an
entry of the RAM tier (inference.engine.tiers); a prefix brought back from a tier is a
`KvRestore` into an empty slot.

This module only does bookkeeping: it returns the KV edits (`KvTrim`, `KvSave`, `KvRestore`) that
the runner must apply, in order.
"""

from dataclasses import dataclass, field


@dataclass(slots=True, frozen=True)
class KvTrim:
    """Remove a sequence's KV from position `start` to the end (0: all of it)."""

    seq_id: int
    start: int


@dataclass(slots=True, frozen=True)
class KvSave:
    """Copy a sequence's KV (it holds `tokens`) into the tiers before an edit drops it."""

    seq_id: int
    tokens: tuple[int, ...]
    partition: str | None
    cache_key: str | None


@dataclass(slots=True, frozen=True)
class KvRestore:
    """Restore a kept entry (`data`, its state, held here so nothing can drop it before the
    step) into an empty sequence and keep its first `keep` tokens: those of the request's
    prompt that it holds."""

    seq_id: int
    request_id: str
    entry: object  # inference.engine.tiers.KvEntry
    data: bytearray
    keep: int


KvOp = KvTrim | KvSave | KvRestore

# Dropping fewer tokens than this (a slot's tail) does not save the slot first.
MIN_SAVED_TAIL = 16


@dataclass(slots=True)
class Slot:
    seq_id: int
    tokens: list[int] = field(default_factory=list)  # what this slot's KV holds when idle
    cache_key: str | None = None
    partition: str | None = None  # whose KV it holds
    last_used: int = 0
    busy: bool = False


# What one more run of consecutive busy sequence ids is worth in prompt tokens when a slot is
# chosen (PrefixCache.added_runs): a run costs a graph pass in every step the request is in
# (~10 ms of a 100 ms step on the 2-core CPU measured), which outweighs reusing a chat
# template's first tokens, not a conversation's history.
RUN_PRICE = 64

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
    def __init__(self, n_slots: int, enabled: bool = True, keeps_dropped: bool = False):
        if n_slots < 1:
            raise ValueError("at least one sequence slot is needed")
        self.slots = [Slot(seq_id=i) for i in range(n_slots)]
        self.enabled = enabled
        self.keeps_dropped = keeps_dropped and enabled  # a save before KV is dropped
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

        def reuse(slot: Slot) -> tuple[int, bool]:
            """(the prompt tokens it holds that count, whether it holds this conversation)."""
            ours = slot.partition == partition or not slot.tokens
            shared = common_prefix(slot.tokens, prompt_ids) if self.enabled and ours else 0
            same_conversation = ours and cache_key is not None and slot.cache_key == cache_key
            if not same_conversation and shared < MIN_REUSE_FRACTION * len(slot.tokens):
                # A BOS token or a common system prompt is not worth another conversation's
                # cache: such a slot counts as unrelated (empty or least recently used wins).
                shared = 0
            return shared, same_conversation

        reuses = {slot.seq_id: reuse(slot) for slot in idle}

        def preference(slot: Slot) -> tuple:
            shared, same_conversation = reuses[slot.seq_id]
            # The conversation's own history first, however short (its next turn's first
            # token is what a person waits for); then the most prompt tokens a slot saves, less
            # what a gap in the busy ids costs (RUN_PRICE a run); then an empty slot, then the
            # least recently used one (the cheapest to give up).
            worth = shared - RUN_PRICE * self.added_runs(slot)
            return (same_conversation and shared > 0, worth, not slot.tokens, -slot.last_used)

        best = max(idle, key=preference)
        return best, min(reuses[best.seq_id][0], len(prompt_ids) - 1)

    def choose_empty(self) -> Slot:
        """The idle slot to restore a kept prefix into: the one that keeps the busy sequence
        ids in the fewest runs (`added_runs`), then an empty one, else the least recently used
        (what it holds is saved first: `save_before_dropping`)."""
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            raise RuntimeError("no idle slot")
        return max(idle, key=lambda s: (-self.added_runs(s), not s.tokens, -s.last_used))

    def added_runs(self, slot: Slot) -> int:
        """How many more runs of consecutive sequence ids the busy slots make once `slot` is
        busy too: -1 where it fills a gap, 0 beside one busy neighbour, 1 on its own. With one
        KV stream per sequence, llama.cpp runs each such run of a step's sequences as a graph
        pass of its own (the runner writes a step in id order: runner.execute); on a 2-core
        CPU eight decodes in one run took 38 ms, split in two by one idle slot 48 ms, so a
        request that leaves a gap costs every step it is in."""
        neighbours = [self.slots[i].busy for i in (slot.seq_id - 1, slot.seq_id + 1)
                      if 0 <= i < len(self.slots)]  # fmt: skip
        return 1 - sum(neighbours)

    def save_before_dropping(self, slot: Slot, keep: int) -> KvSave | None:
        """The save that keeps what `slot` holds past `keep` tokens, when warm memory is on and
        that is worth keeping (a finished turn's KV, not a few tokens of its tail)."""
        if not self.keeps_dropped or slot.busy or len(slot.tokens) - keep < MIN_SAVED_TAIL:
            return None
        return KvSave(slot.seq_id, tuple(slot.tokens), slot.partition, slot.cache_key)

    def kept(self) -> list[KvSave]:
        """A save of every idle slot that holds KV (the runner is stopping)."""
        return [save for s in self.slots if (save := self.save_before_dropping(s, 0))]

    def forget(self, partition: str | None, everything: bool = False) -> list[KvTrim]:
        """Drop the KV idle slots hold for `partition` (or for anyone), unsaved."""
        trims = []
        for slot in self.slots:
            if not slot.busy and slot.tokens and (everything or slot.partition == partition):
                slot.tokens = []
                slot.cache_key = None
                trims.append(KvTrim(slot.seq_id, 0))
        return trims

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

    def evict_one(self, keep: Slot) -> list[KvOp]:
        """Drop the least recently used idle cached slot other than `keep`, if any: its save
        (warm memory on) and its trim, or nothing."""
        candidates = [s for s in self.slots if not s.busy and s.tokens and s is not keep]
        if not candidates:
            return []
        victim = min(candidates, key=lambda s: s.last_used)
        save = self.save_before_dropping(victim, 0)
        victim.tokens = []
        victim.cache_key = None
        return [save, KvTrim(victim.seq_id, 0)] if save else [KvTrim(victim.seq_id, 0)]

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
