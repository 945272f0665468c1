"""The prefix index finds what a look at every entry would find."""

import random

import numpy as np

from inference.engine.tiers.entries import shared_prefix
from inference.engine.tiers.index import PrefixIndex

from .conftest import entry


def every_entry(entries, partition, prompt, at_least=1, min_fraction=0.0):
    """The answer by comparing the prompt with every entry (what the store did before)."""
    best = None
    for e in entries:
        if e.partition != partition:
            continue
        shared = shared_prefix(e.tokens, prompt)
        if shared < at_least or shared < min_fraction * e.n_tokens:
            continue
        if best is None or (shared, e.in_ram) > (best[1], best[0].in_ram):
            best = (e, shared)
    return best


def test_the_index_agrees_with_comparing_every_entry_as_entries_come_and_go():
    rng = random.Random(7)
    index, live = PrefixIndex(), {}
    system = [rng.randrange(50) for _ in range(30)]
    for step in range(1500):
        if live and rng.random() < 0.35:
            gone = live.pop(rng.choice(list(live)))
            index.remove(gone)
        else:
            tail = [rng.randrange(4) for _ in range(rng.randrange(40))]
            tokens = system[: rng.randrange(31)] + tail
            e = entry(tokens or [1], partition=rng.choice(["a", "b"]), entry_id=f"e{step}")
            if rng.random() < 0.5:
                e.data = None  # on disk only
            live[e.id] = e
            index.add(e)
        if step % 7 == 0 and live:  # one comes into RAM or leaves it
            moved = live[rng.choice(list(live))]
            moved.data = None if moved.data is not None else bytearray(b"k")
            index.changed(moved)
        prompt = np.asarray(system[: rng.randrange(31)] + [rng.randrange(4) for _ in range(30)],
                            dtype=np.int32)  # fmt: skip
        for at_least, fraction in ((1, 0.0), (5, 0.5), (20, 0.9)):
            want = every_entry(live.values(), "a", prompt, at_least, fraction)
            got = index.best("a", prompt, at_least, fraction)
            if want is None:
                assert got is None
            else:
                entry_found, shared = got
                assert shared == want[1] and entry_found.in_ram == want[0].in_ram
                assert shared_prefix(entry_found.tokens, prompt) == shared
                assert shared >= fraction * entry_found.n_tokens
        covering = index.covering("a", prompt[:12])
        holds = [e for e in live.values() if e.partition == "a" and e.n_tokens >= 12
                 and shared_prefix(e.tokens, prompt[:12]) == 12]  # fmt: skip
        assert (covering is not None) == bool(holds)
        covered = {e.id for e in index.covered("a", prompt)}
        assert covered == {e.id for e in live.values() if e.partition == "a"
                           and shared_prefix(e.tokens, prompt) == e.n_tokens}  # fmt: skip
    assert len(index) == len(live)


def test_a_lookup_under_a_shared_system_prompt_does_not_visit_every_conversation():
    index = PrefixIndex()
    system = list(range(100))
    for n in range(3000):  # conversations under one system prompt, each longer than twice it
        index.add(entry(system + [1000 + n] * 150, partition="p", entry_id=f"c{n}"))
    short = entry(system + [7, 7], partition="p", entry_id="short")
    index.add(short)
    prompt = np.asarray(system + [9, 9, 9], dtype=np.int32)
    found, shared = index.best("p", prompt, min_fraction=0.5)
    assert found is short and shared == 100
    root = index._roots["p"]
    # The minima the lookup follows: the branch node knows its shortest child at once.
    branch = root.children[0]
    assert branch.least == 102 and branch.top(False) is index._at["short"]
