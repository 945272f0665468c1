"""Engine telemetry: sliding-window throughput, latency distributions and cumulative histograms.

The engine thread records after each step (a few appends under a lock); any thread may take a
`snapshot()` at any time. Cumulative counters and bucketed histograms let /metrics export
Prometheus series from snapshots alone, also when the engine runs in another process.

For the dashboard's "now" the snapshot also carries:
- `now`: throughput over the last NOW_S seconds, 0 as soon as nothing runs;
- `windows`: throughput and TTFT/ITL percentiles over 30 s, 5 min and 1 h, each with a 30-point
  chart (inference.engine.windows);
- `steps`: the last engine steps that ended within STEPS_HORIZON_S, as compact columns (what
  each step carried: decode tokens, prompt tokens, its seconds, its sequences; of the decodes,
  background streams' (`background`); whether an interactive stream decoded in it, so the
  ITL target bound it (`interactive`); how many running requests it left paused for
  interactive work (`paused`); what it spent saving and restoring warm memory before the run
  (`save_ms`, `restore_ms`)); the target that bounded it and the run the cost curve
  predicted (`target_ms`, 0 where none did: a prompt read whole with nobody decoding; and
  `predicted_ms`: how much of the budget
  the steps use, and how far off the scheduler's prediction was), so a long prompt can be
  watched being spread over steps beside a stream's decodes, and background work told from a
  person's;
- `by_priority`: TTFT and ITL distributions and histograms per priority (interactive,
  background), two bounded label values for /metrics;
- `served(now)`: the tokens (prompt chunks and decodes) each (share, priority) was served over
  the window, for the engine's per-app table.
"""

import bisect
import threading
import time
from collections import deque

from inference.engine.generation import PRIORITIES
from inference.engine.stats import distribution
from inference.engine.tiers.entries import TIERS
from inference.engine.windows import Windows

LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
    0.75, 1.0, 2.5, 5.0, 10.0, 20.0, 60.0, float("inf"),
)  # fmt: skip
HISTOGRAMS = ("ttft", "itl", "queue_time", "prefill_time", "e2e")
NOW_S = 2.0
STEPS_KEPT = 300
STEPS_HORIZON_S = 60.0


class _Histogram:
    __slots__ = ("counts", "total", "count")

    def __init__(self) -> None:
        self.counts = [0] * len(LATENCY_BUCKETS)
        self.total = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(LATENCY_BUCKETS, value)] += 1
        self.total += value
        self.count += 1

    def export(self) -> dict:
        cumulative, running = [], 0
        for c in self.counts:
            running += c
            cumulative.append(running)
        return {"buckets": list(LATENCY_BUCKETS), "cumulative": cumulative,
                "sum": self.total, "count": self.count}  # fmt: skip


class Telemetry:
    def __init__(self, window_s: float = 10.0, latency_samples: int = 1000):
        self.window_s = window_s
        self._lock = threading.Lock()
        # (time, prompt tokens, output tokens, sequences in the batch, step seconds)
        self._steps: deque[tuple[float, int, int, int, float]] = deque()
        self._ttft: deque[float] = deque(maxlen=latency_samples)
        self._itl: deque[float] = deque(maxlen=latency_samples * 10)
        self._hist = {name: _Histogram() for name in HISTOGRAMS}
        self._by_priority = {
            priority: {"ttft": deque(maxlen=latency_samples),
                       "itl": deque(maxlen=latency_samples * 10),
                       "histograms": {"ttft": _Histogram(), "itl": _Histogram()}}
            for priority in PRIORITIES
        }  # fmt: skip
        self._windows = Windows()
        # (time, decode tokens, prompt tokens, step seconds, sequences in the batch,
        #  background decode tokens, an interactive stream decoded, requests paused, drafted
        #  tokens verified, output tokens, image positions fed, images being encoded, seconds
        #  saving KV, seconds restoring KV)
        self._recent_steps: deque[tuple] = deque(maxlen=STEPS_KEPT)
        # (time, {(share, priority): tokens served in that step}), over the window
        self._served: deque[tuple[float, dict]] = deque()
        self.totals = {"prompt_tokens": 0, "cached_tokens": 0, "output_tokens": 0,
                       "images_encoded": 0, "images_cached": 0, "encode_seconds": 0.0,
                       "image_tokens": 0, "embedded_inputs": 0, "embedded_tokens": 0,
                       "reranked_documents": 0, "reranked_tokens": 0}  # fmt: skip
        self.outcomes = {"stop": 0, "length": 0, "cancelled": 0, "failed": 0, "rejected": 0}
        # Warm memory since load: admissions by where their cached tokens came from ("miss":
        # none), those tokens by tier, the seconds restoring took and the reading they saved.
        self._reuse = {"admitted": dict.fromkeys((*TIERS, "miss"), 0),
                       "tokens": dict.fromkeys(TIERS, 0),
                       "restore_seconds": 0.0, "saved_seconds": 0.0}  # fmt: skip

    def record_step(
        self,
        now: float,
        prompt: int,
        output: int,
        seqs: int,
        seconds: float,
        decode: int = 0,
        *,
        background_decode: int = 0,
        interactive: bool = False,
        paused: int = 0,
        served: dict | None = None,
        verify: int = 0,
        image: int = 0,
        encoding: int = 0,
        save_s: float = 0.0,
        restore_s: float = 0.0,
        target_s: float = 0.0,
        predicted_s: float = 0.0,
    ) -> None:
        """One step that ended at `now`: `prompt` tokens of prompt chunks and `decode` decode
        tokens ran (`background_decode` of them background streams', `verify` of them drafted
        tokens being verified), `output` tokens were sampled (decodes, kept drafts and prompts
        that completed); `served`: tokens per (share, priority); `image`: of the prompt tokens,
        image positions fed from embeddings; `encoding`: images the encoder thread was
        encoding when the step ended (it runs beside the steps: inference.engine.vision).
        `seconds` is the run's; `save_s` and `restore_s` what the step spent before it saving
        KV into the tiers and restoring it from them; `target_s` the target that bounded it (0:
        none) and `predicted_s` its run's seconds as the scheduler predicted them."""
        with self._lock:
            self._steps.append((now, prompt, output, seqs, seconds))
            self._recent_steps.append((now, decode, prompt, seconds, seqs, background_decode,
                                       interactive, paused, verify, output, image,
                                       encoding, save_s, restore_s, target_s,
                                       predicted_s))  # fmt: skip
            if served:
                self._served.append((now, served))
            self._windows.record_step(now, prompt, output, seconds)
            self.totals["prompt_tokens"] += prompt
            self.totals["output_tokens"] += output
            horizon = now - self.window_s
            while self._steps and self._steps[0][0] < horizon:
                self._steps.popleft()
            while self._served and self._served[0][0] < horizon:
                self._served.popleft()

    def record_images(self, encoded: int, cached: int, seconds: float, tokens: int) -> None:
        """A request's images were read (vision.Encoder): `encoded` through the projector,
        `cached` from the encoder cache, in `seconds`, giving `tokens` image positions."""
        with self._lock:
            for name, value in (("images_encoded", encoded), ("images_cached", cached),
                                ("encode_seconds", seconds), ("image_tokens", tokens)):  # fmt: skip
                self.totals[name] += value

    def record_pooled(self, inputs: int, tokens: int, *, ranked: bool) -> None:
        """An embedding request's `inputs` were pooled, or a reranker scored `inputs` documents
        (inference.engine.embedding), reading `tokens` tokens."""
        kind = "reranked" if ranked else "embedded"
        with self._lock:
            self.totals[f"{kind}_documents" if ranked else f"{kind}_inputs"] += inputs
            self.totals[f"{kind}_tokens"] += tokens

    def record_token_gap(
        self, seconds: float, at: float | None = None, priority: str = "interactive"
    ) -> None:
        with self._lock:
            self._itl.append(seconds)
            self._hist["itl"].observe(seconds)
            self._windows.record_itl(time.perf_counter() if at is None else at, seconds)
            by = self._by_priority[priority]
            by["itl"].append(seconds)
            by["histograms"]["itl"].observe(seconds)

    def record_first_token(
        self,
        ttft: float,
        queue_time: float,
        prefill_time: float,
        at: float | None = None,
        priority: str = "interactive",
    ) -> None:
        with self._lock:
            by = self._by_priority[priority]
            by["ttft"].append(ttft)
            by["histograms"]["ttft"].observe(ttft)
            self._ttft.append(ttft)
            self._windows.record_ttft(time.perf_counter() if at is None else at, ttft)
            self._hist["ttft"].observe(ttft)
            self._hist["queue_time"].observe(queue_time)
            self._hist["prefill_time"].observe(prefill_time)

    def record_outcome(self, outcome: str, e2e: float | None = None, cached: int = 0) -> None:
        with self._lock:
            self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
            self.totals["cached_tokens"] += cached
            if outcome != "rejected":
                self._windows.record_end(time.perf_counter())
            if e2e is not None:
                self._hist["e2e"].observe(e2e)

    def record_reuse(
        self, tier: str | None, tokens: int, restore_s: float, saved_s: float
    ) -> None:
        """A request admitted with `tokens` cached tokens from `tier` (None: none)."""
        with self._lock:
            reuse = self._reuse
            if tier in TIERS and tokens:
                reuse["admitted"][tier] += 1
                reuse["tokens"][tier] += tokens
                reuse["restore_seconds"] += restore_s
                reuse["saved_seconds"] += saved_s
            else:
                reuse["admitted"]["miss"] += 1

    def reuse(self) -> dict:
        with self._lock:
            return {key: dict(value) if isinstance(value, dict) else value
                    for key, value in self._reuse.items()}  # fmt: skip

    def served(self, now: float) -> dict[tuple[str | None, str], int]:
        """Tokens served per (share, priority) over the window ending at `now`."""
        with self._lock:
            steps = [served for at, served in self._served if at >= now - self.window_s]
        totals: dict[tuple[str | None, str], int] = {}
        for served in steps:
            for key, tokens in served.items():
                totals[key] = totals.get(key, 0) + tokens
        return totals

    def snapshot(self, now: float) -> dict:
        with self._lock:
            steps = [s for s in self._steps if s[0] >= now - self.window_s]
            ttft = list(self._ttft)
            itl = list(self._itl)
            histograms = {name: h.export() for name, h in self._hist.items()}
            totals = dict(self.totals)
            outcomes = dict(self.outcomes)
            windows = self._windows.reading(now)
            recent = [s for s in self._recent_steps if s[0] >= now - STEPS_HORIZON_S]
            by_priority = {
                priority: {"ttft": distribution(list(by["ttft"])),
                           "itl": distribution(list(by["itl"])),
                           "histograms": {name: h.export()
                                          for name, h in by["histograms"].items()}}
                for priority, by in self._by_priority.items()
            }  # fmt: skip
        busy = sum(s[4] for s in steps)
        current = [s for s in steps if s[0] >= now - NOW_S]
        return {
            "window_s": self.window_s,
            "prompt_tps": sum(s[1] for s in steps) / self.window_s,
            "output_tps": sum(s[2] for s in steps) / self.window_s,
            "busy_fraction": min(1.0, busy / self.window_s),
            "mean_batch_sequences": (sum(s[3] for s in steps) / len(steps)) if steps else 0.0,
            "ttft": distribution(ttft),
            "itl": distribution(itl),
            "histograms": histograms,
            "by_priority": by_priority,
            "totals": totals,
            "outcomes": outcomes,
            "now": {
                "seconds": NOW_S,
                "prompt_tps": sum(s[1] for s in current) / NOW_S,
                "output_tps": sum(s[2] for s in current) / NOW_S,
            },
            "windows": windows,
            "steps": {
                "ago": [round(now - s[0], 3) for s in recent],
                "decode": [s[1] for s in recent],
                "prompt": [s[2] for s in recent],
                "ms": [round(s[3] * 1000.0, 2) for s in recent],
                "seqs": [s[4] for s in recent],
                "background": [s[5] for s in recent],  # decode tokens of background streams
                "interactive": [s[6] for s in recent],
                "paused": [s[7] for s in recent],
                "verify": [s[8] for s in recent],  # drafted tokens verified (speculation)
                "output": [s[9] for s in recent],
                "image": [s[10] for s in recent],  # of the prompt tokens, image positions
                "encoding": [s[11] for s in recent],  # images being encoded beside the step
                # Before the run (ms is the run's): KV saved into the tiers, and restored.
                "save_ms": [round(s[12] * 1000.0, 2) for s in recent],
                "restore_ms": [round(s[13] * 1000.0, 2) for s in recent],
                # The target that bounded it (0: none did) and the run the curve predicted.
                "target_ms": [round(s[14] * 1000.0, 2) for s in recent],
                "predicted_ms": [round(s[15] * 1000.0, 2) for s in recent],
            },
        }
