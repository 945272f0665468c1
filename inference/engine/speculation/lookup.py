"""Drafts from the sequence itself (prompt lookup decoding, llama.cpp's ngram-simple): the
latest earlier place where its last n tokens occurred, and what followed them there.

An edit that copies a paragraph back, a JSON list of the devices a prompt names, a summary that
quotes: the text to come is, for stretches, text the sequence already holds. Longer n-grams are
tried first (a longer match predicts better). The search is a vectorised scan of the token ids
(numpy): no index to build or keep, ~0.1 ms for 8,000 tokens.
"""

import numpy as np

NGRAMS = (4, 3, 2)  # the n-gram sizes tried, the longest first


class TokenHistory:
    """A sequence's token ids (prompt, then answer) in a growing array."""

    __slots__ = ("ids", "length")

    def __init__(self, prompt: list[int], capacity: int):
        self.ids = np.zeros(max(capacity, len(prompt)) + 1, dtype=np.int32)
        self.ids[: len(prompt)] = prompt
        self.length = len(prompt)

    def append(self, token: int) -> None:
        if self.length == len(self.ids):
            self.ids = np.concatenate([self.ids, np.zeros(len(self.ids), dtype=np.int32)])
        self.ids[self.length] = token
        self.length += 1


def draft(history: TokenHistory, k: int, ngrams: tuple[int, ...] = NGRAMS) -> list[int]:
    """Up to `k` tokens that followed the latest earlier occurrence of the sequence's last n
    tokens, for the longest n that occurred; [] when none did."""
    if k <= 0:
        return []
    ids, length = history.ids, history.length
    for n in ngrams:
        if length <= n:
            continue
        tail = ids[length - n : length]
        # Starts s < length - n of an earlier occurrence: ids[s + j] == tail[j] for every j.
        match = ids[: length - n] == tail[0]
        for j in range(1, n):
            match &= ids[j : length - n + j] == tail[j]
        starts = np.flatnonzero(match)
        if starts.size:
            after = int(starts[-1]) + n
            return ids[after : min(after + k, length)].tolist()
    return []
