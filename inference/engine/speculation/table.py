"""Drafts from earlier answers: an n-gram table learnt per partition (llama.cpp's ngram-cache).

What an app's earlier answers said after a context of CONTEXT tokens is what its next answer is
likely to say after it too: a tagger's JSON keys, a satellite's phrasing. The table is per
partition (an app's key, a person): one shared across apps, as llama-server's ngram-mod is
across slots, would let one app's acceptance rate and timing reveal another's text. Bounded:
at most MAX_CONTEXTS contexts per partition, least recently learnt first out, and at most
MAX_PARTITIONS partitions, least recently used first out.
"""

from collections import OrderedDict, defaultdict

CONTEXT = 3  # tokens of context a prediction keys on
MAX_CONTEXTS = 50_000  # per partition (~10 MB)
MAX_PARTITIONS = 64


class NgramTable:
    def __init__(self, max_contexts: int = MAX_CONTEXTS, max_partitions: int = MAX_PARTITIONS):
        self.max_contexts = max_contexts
        self.max_partitions = max_partitions
        # partition -> context -> next token -> count, each in least-recently-used order
        self._tables: OrderedDict[str | None, OrderedDict[tuple, dict[int, int]]] = OrderedDict()

    def learn(self, partition: str | None, tokens: list[int]) -> None:
        """What an answer said (its tokens, with the last CONTEXT of its prompt before them)."""
        table = self._table(partition)
        for i in range(CONTEXT, len(tokens)):
            context = tuple(tokens[i - CONTEXT : i])
            counts = table.pop(context, None) or defaultdict(int)
            counts[tokens[i]] += 1
            table[context] = counts
        while len(table) > self.max_contexts:
            table.popitem(last=False)

    def draft(self, partition: str | None, recent: list[int], k: int) -> list[int]:
        """Up to `k` tokens, each the most frequent after the last CONTEXT tokens so far."""
        table = self._tables.get(partition)
        if table is None or k <= 0 or len(recent) < CONTEXT:
            return []
        self._tables.move_to_end(partition)
        window = list(recent[-CONTEXT:])
        out: list[int] = []
        while len(out) < k:
            counts = table.get(tuple(window[-CONTEXT:]))
            if not counts:
                break
            token = max(counts.items(), key=lambda item: (item[1], -item[0]))[0]
            out.append(token)
            window.append(token)
        return out

    def forget(self, partition: str | None = None, *, everything: bool = False) -> None:
        if everything:
            self._tables.clear()
        else:
            self._tables.pop(partition, None)

    def _table(self, partition: str | None) -> OrderedDict:
        table = self._tables.get(partition)
        if table is None:
            table = self._tables[partition] = OrderedDict()
            while len(self._tables) > self.max_partitions:
                self._tables.popitem(last=False)
        self._tables.move_to_end(partition)
        return table

    @property
    def contexts(self) -> int:
        return sum(len(table) for table in self._tables.values())
