"""Turning sampled token ids into streamed text: UTF-8 safe, and stop-string aware.

A token's bytes can end in the middle of a multi-byte character, so bytes go through an
incremental UTF-8 decoder that only releases whole characters. Text that could be the start of a
stop string is held back until it is clear either way, so a stop string never leaks to the client.
"""

import codecs


class TextStream:
    def __init__(self, stop: tuple[str, ...] = ()):
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._stop = stop
        self._held = ""  # decoded text not yet released (a possible stop-string prefix)
        self.text = ""  # everything released so far
        self.stopped = False
        self.matched: str | None = None  # the stop string that ended the text, once one has

    def feed(self, piece: bytes) -> str:
        """Add one token's bytes; return the text that may be sent now."""
        if self.stopped:
            return ""
        self._held += self._decoder.decode(piece)
        if not self._stop:
            return self._release(len(self._held))
        # The earliest match, whichever stop string it is: text before it is all that may go.
        hits = [(at, stop) for stop in self._stop if (at := self._held.find(stop)) != -1]
        if hits:
            self.stopped = True
            at, self.matched = min(hits, key=lambda hit: hit[0])
            return self._release(at, drop_rest=True)
        return self._release(len(self._held) - self._partial_stop_suffix())

    def flush(self) -> str:
        """The generation ended: release whatever was held back."""
        if self.stopped:
            return ""
        self._held += self._decoder.decode(b"", final=True)
        return self._release(len(self._held))

    def _partial_stop_suffix(self) -> int:
        """Length of the longest tail of the held text that begins some stop string."""
        longest = 0
        held = self._held
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(held)), longest, -1):
                if held.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _release(self, upto: int, drop_rest: bool = False) -> str:
        out = self._held[:upto]
        self._held = "" if drop_rest else self._held[upto:]
        self.text += out
        return out
