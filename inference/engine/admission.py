"""Whose turn it is: the order in which waiting requests are admitted, fair across shares.

A request's share (GenerationRequest.share: an app's key, a person) is whose turn it takes.
Requests without one form one anonymous share (None): unattributed work counts as one more app,
never as a way around the queue. The order, once:

1. Interactive requests before any background request (a person reads the answer).
2. Within a priority, start-time fair queuing in tokens across shares: a share's waiting
   requests, oldest first, are tagged `usage + the prompt tokens of its requests ahead`, where
   usage is what the share was served recently (prompt chunks and decodes as they ran, halving
   every `half_life` seconds); the smallest tag goes first, ties to the oldest request. A share
   that was served less gets more turns, whatever its requests' sizes.
3. A share with nothing running counts as having been served no more than the least served share
   waiting beside it (a tie goes to the share really served less), so another share's backlog,
   however long, delays its first request by one admission at most.
4. Within a share, arrival order.

The scheduler charges what each step serves (`charge`) and asks for the order (`order`); this
module holds no requests, only each share's usage.
"""

import math

from inference.engine.generation import PRIORITIES
from inference.engine.request import Request

HALF_LIFE_S = 30.0  # a burst is forgotten within a minute or two; a flood is remembered
FORGOTTEN = 0.5  # tokens of usage below which a share's entry is dropped


class FairShare:
    def __init__(self, half_life: float = HALF_LIFE_S):
        self.half_life = half_life
        self._usage: dict[str | None, tuple[float, float]] = {}  # share -> (tokens, as of when)

    def usage(self, share: str | None, now: float) -> float:
        """Tokens served to the share recently, decayed to `now`."""
        entry = self._usage.get(share)
        if entry is None:
            return 0.0
        tokens, at = entry
        return tokens * math.exp2(-max(0.0, now - at) / self.half_life)

    def charge(self, share: str | None, tokens: int, now: float) -> None:
        self._usage[share] = (self.usage(share, now) + tokens, now)

    def forget(self, now: float) -> None:
        """Drop shares whose usage has decayed to nothing (the table stays small)."""
        for share in [s for s in self._usage if self.usage(s, now) < FORGOTTEN]:
            del self._usage[share]

    def order(self, waiting: list[Request], running: list[Request], now: float) -> list[Request]:
        """The waiting requests in the order they are admitted (steps 1-4 above)."""
        return [request for _, request in self.turns(waiting, running, now)]

    def turns(
        self, waiting: list[Request], running: list[Request], now: float
    ) -> list[tuple[float, Request]]:
        """The admission order with each request's tag: the tokens its share will have been
        served when its turn comes (comparable with `usage()` of a running request's share)."""
        busy = {r.share for r in running}
        ordered: list[tuple[float, Request]] = []
        for priority in PRIORITIES:  # 1. interactive first
            queues: dict[str | None, list[Request]] = {}
            for request in waiting:
                if request.priority == priority:
                    queues.setdefault(request.share, []).append(request)  # 4. arrival order
            usage = {share: self.usage(share, now) for share in queues}
            tagged = []
            for share, queue in queues.items():
                tag = usage[share]
                if share not in busy and len(queues) > 1:  # 3. a first request
                    tag = min(tag, min(u for s, u in usage.items() if s != share))
                for request in queue:  # 2. tags in tokens
                    tagged.append((tag, usage[share], request.accepted_at, len(tagged), request))
                    tag += request.prompt_len
            ordered += [(entry[0], entry[-1]) for entry in sorted(tagged, key=lambda e: e[:4])]
        return ordered
