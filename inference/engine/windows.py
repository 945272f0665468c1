"""Rolling windows of engine activity (30 s, 5 min, 1 h), for the dashboard's window selector.

Each window is a ring of 30 time slots (1 s, 10 s and 2 min wide). A slot sums the tokens and
busy seconds of the steps that ended in it and keeps TTFT and ITL samples as a log-binned
histogram (bins 5 % apart, so a percentile is within 2.5 % of the exact one). Recording costs
a few dict increments per window; a reading merges at most 30 small histograms per window and
never sorts raw samples, so an hour of tokens costs no more to read than a minute.

Times are the engine's `time.perf_counter()` seconds; slots start at multiples of their width.
"""

import math
from collections import deque

WINDOWS_S = (30, 300, 3600)
POINTS = 30  # slots per window: the window's chart has one point per slot
BASE_S = 1e-4  # the lowest bin's lower edge (0.1 ms)
RATIO = 1.05
_LOG_RATIO = math.log(RATIO)


def _bin(value: float) -> int:
    if value <= BASE_S:
        return 0
    return int(math.log(value / BASE_S) / _LOG_RATIO)


def _representative(index: int) -> float:
    return BASE_S * RATIO ** (index + 0.5)


class LogHistogram:
    """Latency samples as counts per log bin, with the exact maximum."""

    __slots__ = ("bins", "count", "max")

    def __init__(self) -> None:
        self.bins: dict[int, int] = {}
        self.count = 0
        self.max = 0.0

    def add(self, value: float) -> None:
        index = _bin(value)
        self.bins[index] = self.bins.get(index, 0) + 1
        self.count += 1
        if value > self.max:
            self.max = value

    def merge(self, other: "LogHistogram") -> None:
        for index, n in other.bins.items():
            self.bins[index] = self.bins.get(index, 0) + n
        self.count += other.count
        self.max = max(self.max, other.max)

    def quantile(self, q: float) -> float | None:
        """Nearest-rank quantile (q in 0..100), as in inference.engine.stats.percentile."""
        if not self.count:
            return None
        rank = max(1, math.ceil(q / 100.0 * self.count))
        seen = 0
        for index in sorted(self.bins):
            seen += self.bins[index]
            if seen >= rank:
                return min(_representative(index), self.max)
        return self.max

    def distribution(self) -> dict:
        return {
            "p50": self.quantile(50),
            "p95": self.quantile(95),
            "p99": self.quantile(99),
            "max": self.max if self.count else None,
            "count": self.count,
        }


class _Slot:
    __slots__ = ("index", "prompt", "output", "busy", "ended", "ttft", "itl", "point")

    def __init__(self, index: int) -> None:
        self.index = index
        self.prompt = 0
        self.output = 0
        self.busy = 0.0
        self.ended = 0  # requests that ended in this slot, any outcome
        self.ttft = LogHistogram()
        self.itl = LogHistogram()
        self.point: tuple | None = None  # the chart point, computed once the slot has closed


class Window:
    """One window: POINTS slots of `seconds / POINTS` each."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.width = seconds / POINTS
        self._slots: deque[_Slot] = deque()

    def _slot(self, now: float) -> _Slot:
        index = int(now // self.width)
        slots = self._slots
        if not slots or slots[-1].index < index:
            slots.append(_Slot(index))
            while slots[0].index <= index - POINTS:
                slots.popleft()
        elif slots[-1].index > index:  # a time from before the newest slot: the slot it had
            for slot in reversed(slots):
                if slot.index <= index:
                    return slot
            return slots[0]  # older than the window: the oldest slot stands for it
        return slots[-1]

    def record_step(self, now: float, prompt: int, output: int, seconds: float) -> None:
        slot = self._slot(now)
        slot.prompt += prompt
        slot.output += output
        slot.busy += seconds

    def record_ttft(self, now: float, value: float) -> None:
        self._slot(now).ttft.add(value)

    def record_itl(self, now: float, value: float) -> None:
        self._slot(now).itl.add(value)

    def record_end(self, now: float) -> None:
        self._slot(now).ended += 1

    def reading(self, now: float) -> dict:
        """The window's totals, and its chart: one point per slot, oldest first, the last one
        the slot now filling (its rates over the part of it that has passed)."""
        current = int(now // self.width)
        first = current - POINTS + 1
        covered = max(now - first * self.width, 1e-9)  # the window as the slots cover it
        by_index = {slot.index: slot for slot in self._slots if slot.index >= first}
        ttft, itl = LogHistogram(), LogHistogram()
        prompt = output = ended = 0
        busy = 0.0
        columns: dict[str, list] = {key: [] for key in _COLUMNS}
        for index in range(first, current + 1):
            slot = by_index.get(index)
            if slot is None:
                point = _EMPTY
            else:
                ttft.merge(slot.ttft)
                itl.merge(slot.itl)
                prompt, output = prompt + slot.prompt, output + slot.output
                busy, ended = busy + slot.busy, ended + slot.ended
                if index < current:
                    if slot.point is None:
                        slot.point = _point(slot, self.width)
                    point = slot.point
                else:
                    point = _point(slot, max(now - index * self.width, 1e-3))
            for key, value in zip(_COLUMNS, point, strict=True):
                columns[key].append(value)
        return {
            "seconds": self.seconds,
            "prompt_tps": prompt / covered,
            "output_tps": output / covered,
            "busy_fraction": min(1.0, busy / covered),
            "ended": ended,
            "ttft": ttft.distribution(),
            "itl": itl.distribution(),
            "series": {"step_s": self.width, **columns},
        }


_COLUMNS = ("prompt_tps", "output_tps", "ttft_p50", "ttft_p95", "ttft_p99",
            "itl_p50", "itl_p95", "itl_p99")  # fmt: skip
_EMPTY = (0.0, 0.0, None, None, None, None, None, None)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _point(slot: _Slot, seconds: float) -> tuple:
    return (
        round(slot.prompt / seconds, 1),
        round(slot.output / seconds, 1),
        *(_round(slot.ttft.quantile(q), 4) for q in (50, 95, 99)),
        *(_round(slot.itl.quantile(q), 4) for q in (50, 95, 99)),
    )


class Windows:
    """The three windows together, recorded into at once."""

    def __init__(self, windows_s: tuple[float, ...] = WINDOWS_S) -> None:
        self.windows = [Window(seconds) for seconds in windows_s]

    def record_step(self, now: float, prompt: int, output: int, seconds: float) -> None:
        for window in self.windows:
            window.record_step(now, prompt, output, seconds)

    def record_ttft(self, now: float, value: float) -> None:
        for window in self.windows:
            window.record_ttft(now, value)

    def record_itl(self, now: float, value: float) -> None:
        for window in self.windows:
            window.record_itl(now, value)

    def record_end(self, now: float) -> None:
        for window in self.windows:
            window.record_end(now)

    def reading(self, now: float) -> dict[str, dict]:
        """{"30": {...}, "300": {...}, "3600": {...}}: string keys, as JSON has them."""
        return {str(int(w.seconds)): w.reading(now) for w in self.windows}
