"""Caps on what one app or one person holds at once, so nobody fills the engine for everyone:
concurrent answers per API key (MAX_STREAMS_PER_KEY) and chat sockets per user
(MAX_SOCKETS_PER_USER; each socket runs one answer at a time), and chat answers per user
(the same cap; an answer keeps running when its socket goes away).

Counted in this web process: exact in embedded mode; in split mode with several web processes
each enforces the cap on its own share.
"""

import threading
from collections import Counter


class Holdings:
    """How many of something each holder has; `take` refuses past the cap."""

    def __init__(self):
        self._held: Counter[str] = Counter()
        self._lock = threading.Lock()  # API views and consumers run on one loop; sync callers too

    def take(self, holder: str, cap: int) -> bool:
        with self._lock:
            if self._held[holder] >= cap:
                return False
            self._held[holder] += 1
            return True

    def give_back(self, holder: str) -> None:
        with self._lock:
            self._held[holder] -= 1
            if self._held[holder] <= 0:
                del self._held[holder]

    def held(self, holder: str) -> int:
        with self._lock:
            return self._held[holder]


api_streams = Holdings()  # holder: "apikey:<id>"
chat_sockets = Holdings()  # holder: "user:<id>"
# Chat answers running per user (they outlive their socket: a reload reattaches), under the
# same cap as the sockets.
chat_answers = Holdings()  # holder: "user:<id>"
