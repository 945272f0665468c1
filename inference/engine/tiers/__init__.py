"""Warm memory: the KV of a prompt the box has read, kept beyond its sequence slot.

A sequence's KV about to be dropped (a kept slot given to another request, the model unloaded,
its runner stopping) is saved (llama_state_seq_get_data) with its token ids into a bounded
host-RAM tier, and from there, least recently used first, into a bounded disk tier under the
data directory. At admission the longest usable prefix of the new prompt is looked up across
the resident slots and both tiers, within the request's own partition, and restored when that
costs less than reading it again.

    entries  what an entry is: its layout (what must match for a restore), tokens, bytes
    store    the two tiers' bookkeeping: lookup, put, bounds, forget (engine thread only)
    index    which entries share a prefix with a prompt, without looking at every entry
    files    the disk format of one entry and the directory of a model's entries
    forgets  forgets written down before they are done, applied by whoever holds the entries
    disk     the disk tier: the directory and the I/O thread that reads and writes it
    images   encoded images on disk (a vision model's), beside its kept prompts
    ledger   the disk bound, the box's: every runner's writes reserved against one account
    costs    restore or recompute, from measured rates
"""

from inference.engine.tiers.costs import RestoreCosts
from inference.engine.tiers.entries import KvEntry, KvLayout, shared_prefix
from inference.engine.tiers.store import Hit, PromptStore

__all__ = ["Hit", "KvEntry", "KvLayout", "PromptStore", "RestoreCosts", "shared_prefix"]
