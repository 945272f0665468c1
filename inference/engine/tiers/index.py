"""Which kept entries share a prefix with a prompt, found without looking at every entry.

A radix tree of token ids per partition: each edge holds a run of tokens, each entry hangs at
the node where its tokens end, and a node's children are keyed by their edge's first token. A
prompt walks down from its partition's root as far as it matches; an entry shares with it the
depth at which their paths part. So the entries sharing the most tokens are under the point
where the walk stopped, the next ones hang off the nodes above it, and a lookup costs the
prompt's path, not the number of entries (20k conversations under one system prompt included).

Each node knows the fewest tokens of any entry below it, and of any entry below it in RAM, so
a lookup that wants an entry at least `min_fraction` of which is shared (a long conversation is
not restored whole for its system prompt) finds the shortest one without visiting the others.
Those minima reach a parent through a heap of its children's (stale ones are skipped when
read), so keeping them costs a path's length per change, whatever a node's fan-out.

Not thread-safe: the store calls it under its lock.
"""

import heapq
import itertools
import math

import numpy as np

from inference.engine.tiers.entries import KvEntry, shared_prefix

_NONE = math.inf  # "no entry below"
_order = itertools.count()  # ties in a heap never compare nodes


class _Node:
    __slots__ = ("parent", "label", "depth", "children", "entries", "least", "least_ram",
                 "heap", "heap_ram")  # fmt: skip

    def __init__(self, parent: "_Node | None", label: np.ndarray, depth: int):
        self.parent = parent
        # The tokens of the edge from the parent: a view of the entry's tokens that made it
        # (its array lives as long as the node: at most one per node), copied only at a merge.
        self.label = label
        self.depth = depth  # tokens from the root to here
        self.children: dict[int, _Node] = {}
        self.entries: dict[str, KvEntry] = {}  # entries whose tokens end here
        self.least = _NONE  # the fewest tokens of an entry at or below this node
        self.least_ram = _NONE  # the same, among entries in RAM
        self.heap: list = []  # (child.least, order, child): stale rows skipped when read
        self.heap_ram: list = []

    def top(self, ram: bool, skip: "_Node | None" = None) -> "_Node | None":
        """The child with the fewest tokens below it (in RAM with `ram`), other than `skip`."""
        heap = self.heap_ram if ram else self.heap
        skipped = None
        while heap:
            value, _, child = heap[0]
            if child.parent is not self or value != (child.least_ram if ram else child.least):
                heapq.heappop(heap)  # stale: the child moved or changed since
                continue
            if child is skip:
                skipped = heapq.heappop(heap)
                continue
            break
        found = heap[0][2] if heap else None
        if skipped is not None:
            heapq.heappush(heap, skipped)
        return found


def _offer(parent: _Node, child: _Node) -> None:
    """Tell `parent` of its child's minima (the rows they replace turn stale)."""
    heapq.heappush(parent.heap, (child.least, next(_order), child))
    heapq.heappush(parent.heap_ram, (child.least_ram, next(_order), child))
    if len(parent.heap) > 2 * len(parent.children) + 8:  # drop the stale rows now and then
        mine = [c for c in parent.children.values()]
        parent.heap = [(c.least, next(_order), c) for c in mine]
        parent.heap_ram = [(c.least_ram, next(_order), c) for c in mine]
        heapq.heapify(parent.heap)
        heapq.heapify(parent.heap_ram)


class PrefixIndex:
    def __init__(self):
        self._roots: dict[str | None, _Node] = {}
        self._at: dict[str, _Node] = {}  # entry id -> the node it hangs at

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, entry: KvEntry) -> bool:
        return entry.id in self._at

    # --- changes -----------------------------------------------------------------------------

    def add(self, entry: KvEntry) -> None:
        tokens = entry.tokens
        node = self._roots.get(entry.partition)
        if node is None:
            node = self._roots[entry.partition] = _Node(None, tokens[:0], 0)
        while node.depth < len(tokens):
            child = node.children.get(int(tokens[node.depth]))
            if child is None:
                leaf = _Node(node, tokens[node.depth :], len(tokens))
                node.children[int(tokens[node.depth])] = leaf
                node = leaf
                break
            matched = shared_prefix(child.label, tokens[node.depth :])
            if matched < len(child.label):
                node = self._split(child, matched)
            else:
                node = child
        node.entries[entry.id] = entry
        self._at[entry.id] = node
        self._refresh(node)

    def remove(self, entry: KvEntry) -> None:
        node = self._at.pop(entry.id, None)
        if node is None:
            return
        del node.entries[entry.id]
        # A node that holds nothing goes; one left with a single child merges into it.
        while node.parent is not None and not node.entries and not node.children:
            parent = node.parent
            del parent.children[int(node.label[0])]
            node.parent = None
            node = parent
        if node.parent is not None and not node.entries and len(node.children) == 1:
            (child,) = node.children.values()
            parent = node.parent
            child.label = np.concatenate((node.label, child.label))
            child.parent = parent
            parent.children[int(child.label[0])] = child
            node.parent = None
            _offer(parent, child)
            node = parent  # the child's minima stand; its new parent's may not
        if node.parent is None and not node.entries and not node.children:
            self._roots.pop(entry.partition, None)
            return
        self._refresh(node)

    def changed(self, entry: KvEntry) -> None:
        """The entry came into RAM or left it."""
        node = self._at.get(entry.id)
        if node is not None:
            self._refresh(node)

    def _split(self, child: _Node, at: int) -> _Node:
        parent = child.parent
        middle = _Node(parent, child.label[:at], parent.depth + at)
        parent.children[int(middle.label[0])] = middle
        child.label = child.label[at:]
        child.parent = middle
        middle.children[int(child.label[0])] = child
        _offer(middle, child)
        middle.least, middle.least_ram = child.least, child.least_ram
        _offer(parent, middle)
        return middle

    def _refresh(self, node: _Node) -> None:
        """Bring the minima of `node` and of the nodes above it up to date."""
        while node is not None:
            least = node.depth if node.entries else _NONE
            least_ram = (node.depth if any(e.data is not None for e in node.entries.values())
                         else _NONE)  # fmt: skip
            top, top_ram = node.top(False), node.top(True)
            least = min(least, top.least if top is not None else _NONE)
            least_ram = min(least_ram, top_ram.least_ram if top_ram is not None else _NONE)
            if (least, least_ram) == (node.least, node.least_ram) and node.depth:
                return
            node.least, node.least_ram = least, least_ram
            if node.parent is not None:
                _offer(node.parent, node)
            node = node.parent

    # --- questions ---------------------------------------------------------------------------

    def best(
        self, partition: str | None, prompt: np.ndarray, at_least: int = 1,
        min_fraction: float = 0.0, ram_only: bool = False,
    ) -> tuple[KvEntry, int] | None:  # fmt: skip
        """The entry sharing the longest prefix with `prompt` (at least `at_least` tokens, and
        at least `min_fraction` of the entry's), and how many; of equal ones, one in RAM
        (`ram_only`: only those)."""
        path, partial, depth = self._walk(partition, prompt)
        # Deepest first: (tokens shared, the node whose own entries share them, and where
        # below it: a list of subtrees, or None / a child: the node's children but that one).
        levels = []
        if partial is not None:
            levels.append((depth, None, [partial]))
        below = partial
        for node in reversed(path):
            levels.append((node.depth, node, below))
            below = node
        for shared, node, children in levels:
            if shared < max(at_least, 1):
                return None
            limit = shared / min_fraction if min_fraction > 0 else math.inf
            for ram in (True,) if ram_only else (True, False):
                found = self._shortest(node, children, ram, limit)
                if found is not None:
                    return found, shared
        return None

    def covering(self, partition: str | None, tokens: np.ndarray) -> KvEntry | None:
        """An entry that holds all of `tokens` (and maybe more), if any."""
        path, partial, depth = self._walk(partition, tokens)
        if depth < len(tokens) or not path:
            return None
        return self._descend(partial if partial is not None else path[-1], False, math.inf)

    def covered(self, partition: str | None, tokens: np.ndarray) -> list[KvEntry]:
        """The entries whose tokens are all a prefix of `tokens`."""
        path, _, _ = self._walk(partition, tokens)
        return [e for node in path for e in node.entries.values()]

    def _walk(self, partition: str | None, prompt: np.ndarray):
        """The nodes `prompt` matches whole from the root down, the child it goes into part of
        the way (or None), and how many tokens it matches in all."""
        node = self._roots.get(partition)
        if node is None:
            return [], None, 0
        path = [node]
        while node.depth < len(prompt):
            child = node.children.get(int(prompt[node.depth]))
            if child is None:
                return path, None, node.depth
            matched = shared_prefix(child.label, prompt[node.depth :])
            if matched < len(child.label):
                return path, child, node.depth + matched
            path.append(child)
            node = child
        return path, None, node.depth

    def _shortest(self, node, children, ram: bool, limit: float) -> KvEntry | None:
        """One level of `best`: an entry of `node`'s own, else the shortest (within `limit`)
        below `children` (a list), or below `node`'s children other than `children` (a node,
        or None: all of them)."""
        if node is not None:
            for entry in node.entries.values():
                if not ram or entry.data is not None:
                    return entry
        if isinstance(children, list):
            for child in children:
                found = self._descend(child, ram, limit)
                if found is not None:
                    return found
            return None
        if node is None:
            return None
        top = node.top(ram, skip=children)  # children: the path's own child, left out
        if top is None or (top.least_ram if ram else top.least) > limit:
            return None
        return self._descend(top, ram, limit)

    @staticmethod
    def _descend(node: _Node, ram: bool, limit: float) -> KvEntry | None:
        """The entry with the fewest tokens at or below `node` (in RAM with `ram`), if it has no
        more than `limit`."""
        if (node.least_ram if ram else node.least) > limit:
            return None
        while True:
            here = node.depth == (node.least_ram if ram else node.least)
            if here:
                for entry in node.entries.values():
                    if not ram or entry.data is not None:
                        return entry
            child = node.top(ram)
            if child is None:
                return None
            node = child
