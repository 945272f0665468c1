"""The per-step token budget: how long a step may take, given who reads it, and what fits.

1. The target. A step that carries an interactive decoding stream (a person reads it) may take
   `itl_target`; a step whose decoding streams are all background (an app, or an answer whose
   page has gone) is sized at the cost curve's knee within the loose `background_itl_target`
   (8. below), so a flood runs at the batch size that suits the machine and still never
   freezes; with nobody decoding a person's prompt is read in the whole batch (n_batch),
   background prompts in a step at the knee; unchunked, a step takes the whole batch.
2. The cost of a step. Measured step times are kept by size, in buckets of powers of two, each
   the median of its own last few steps (one step stalled by another process moves nothing),
   and read as a curve through the buckets' centroids: per-token cost falls with size and not
   linearly (on a 2-core CPU a step of a 16-token chunk cost ~1.6x per token what a 512-token
   batch did, and a 128-token chunk less than a 64-token one), which a straight line through
   small and large steps gets wrong at both ends. Where no bucket has data, and beyond the
   measured sizes, a linear fit `overhead + per_token * tokens` (online least squares with
   forgetting) stands in.
3. The budget is the largest step the curve predicts to fit the target (with headroom, 7.),
   so a mixed step carries as many prompt tokens as the target allows, never fewer than one
   token per decoding sequence plus `min_chunk`, never more than n_batch.
4. The starvation guard: when even the decodes alone overrun the target (an overloaded box, a
   model too big for it), the prompt shares the step instead of being read `min_chunk` tokens at
   a time (see `tokens()`). Work that may wait (a background prompt beside a person's stream)
   is left out of it: it gets only what fits the target, so the guard never stretches a step
   a person reads for an app's sake.
5. Seconds a step spends besides its tokens (restoring kept prompts, inference.engine.tiers)
   come off the target before the tokens are counted.
6. The target is a reader's: the gap between two tokens is the step's run and the work between
   two runs (scheduling, handing tokens over, the runner's round trip), so the measured time
   between runs comes off the target too (`between_steps`).
7. Its own error. Each step's prediction is kept beside what the step took (`StepError`), and
   the headroom is what that error says, not a fixed margin: the run may take the target
   divided by the 90th percentile of actual/predicted over recent steps, so nine steps in ten
   end within the target and the steps fill it rather than staying far under it (with a
   prior of 0.8 until enough steps are measured). The step log shows each step's target and
   prediction beside its time.
8. A step nobody reads (all background) has the knee of the cost curve for its target, not
   the whole loose target: the time of the smallest measured size whose cost per token is
   within KNEE_SLACK of the cheapest within the loose target (less the work between steps and
   the headroom, as any target). The knee is read afresh from the curve each step, so as
   sizes go stale and others are measured it follows the machine. A flood loses next to
   nothing by it (past the knee, larger steps save little per token), and a person who
   arrives waits behind a step of that size, not of the whole background target. How much
   shorter that is depends on the machine: on the 2-core CPU measured, a 265-token step still
   cost 3.2 ms a token against 3.7 at 129 and 5 at 17, so its knee stays near the loose target.
9. Steps that verify drafts (speculation) are timed on a curve of their own (`verify_times`):
   logits at every drafted position, and streams of unequal length that llama.cpp splits into
   several passes, make them dearer than a plain step of the same size (on the 2-core CPU,
   eight clients: the one curve read 20 tokens at 87 ms, plain steps took 83 for 24). Mixed
   into one curve they read every size as dearer than it is, the budget shrank every step, and
   speculation measured its payoff against the inflated curve and went on. The runner's
   calibration (logits at every position) starts both curves: the verify curve keeps its
   sizes, the plain curve lets its own steps replace them (they overstate a prompt chunk, so
   the first chunks err small).
"""

import statistics
from collections import deque
from dataclasses import dataclass, field

ERROR_QUANTILE = 0.9  # the share of steps meant to end within their target
ERROR_WINDOW = 64  # recent steps whose error is weighed
ERROR_SAMPLES = 16  # steps measured before the error replaces the prior headroom
HEADROOM = (0.5, 1.0)  # the least and most of the target a step is planned to take
BETWEEN_WINDOW = 32  # recent gaps between two runs whose median is the work between steps
KNEE_SLACK = 0.1  # a background step's cost per token may exceed the cheapest by this much


@dataclass(slots=True)
class StepCostModel:
    """Online weighted least squares of step time against token count."""

    forgetting: float = 0.9  # weight of the past per observation: ~10 steps of memory
    overhead: float = 0.010  # seconds; priors until measurements arrive
    per_token: float = 0.005
    _w: float = 0.0
    _sn: float = 0.0
    _st: float = 0.0
    _snn: float = 0.0
    _snt: float = 0.0
    fitted: bool = False  # whether the last steps had the spread in sizes to fit both terms

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        f = self.forgetting
        self._w = self._w * f + 1.0
        self._sn = self._sn * f + tokens
        self._st = self._st * f + seconds
        self._snn = self._snn * f + tokens * tokens
        self._snt = self._snt * f + tokens * seconds
        mean_n = self._sn / self._w
        mean_t = self._st / self._w
        var_n = self._snn / self._w - mean_n * mean_n
        if var_n > 1.0:
            slope = (self._snt / self._w - mean_n * mean_t) / var_n
            if slope > 0:
                self.fitted = True
                self.per_token = slope
                self.overhead = max(0.0, mean_t - slope * mean_n)
                return
        self.fitted = False
        # Too little spread in batch sizes to separate the two terms: keep the overhead and
        # attribute the rest of the time to the tokens, but never let the overhead claim more
        # than half of a step (a per-token cost near zero would open the budget to a full
        # batch and let the next long prompt stall every stream).
        self.overhead = min(self.overhead, 0.5 * mean_t)
        self.per_token = (mean_t - self.overhead) / mean_n

    def predict(self, tokens: int) -> float:
        return self.overhead + self.per_token * tokens


@dataclass(slots=True)
class _Bucket:
    steps: deque  # its last (tokens, seconds)
    last_seen: int = 0  # the observation count when it was last measured
    calibrated: bool = False  # seeded by the runner's calibration: never set aside

    def centroid(self) -> tuple[float, float]:
        """(mean size, the median seconds per token times that size)."""
        tokens = sum(n for n, _ in self.steps) / len(self.steps)
        return tokens, tokens * statistics.median(t / n for n, t in self.steps)


@dataclass(slots=True)
class StepTimes:
    """Measured step times by size: one bucket per power of two of the token count.

    `curve()` is the buckets' centroids, smallest first; between two centroids a step's time is
    read off the line joining them, beyond them the linear fit's slope extends the curve. A
    bucket keeps the last `window` steps of its size, so each size follows the machine (and
    the growing attention cost of a deep prompt) within a few of its steps while a single
    outlier moves nothing; one not measured for `stale_after` steps of any size is set aside
    (a size the budget avoids after a bad reading gets another chance).
    """

    linear: StepCostModel = field(default_factory=StepCostModel)
    window: int = 5
    stale_after: int = 500
    _buckets: dict[int, _Bucket] = field(default_factory=dict)
    _seen: int = 0
    # curve() as of the last observation: it changes only when a step is observed, and the
    # budget and speculation's allocation read it dozens of times a step (a median a bucket).
    _curve: list | None = None

    def observe(self, tokens: int, seconds: float) -> None:
        if tokens <= 0 or seconds <= 0:
            return
        self.linear.observe(tokens, seconds)
        self._seen += 1
        index = tokens.bit_length() - 1
        bucket = self._buckets.get(index)
        if bucket is None:
            bucket = self._buckets[index] = _Bucket(deque(maxlen=self.window))
        bucket.steps.append((tokens, seconds))
        bucket.last_seen = self._seen
        self._curve = None

    def calibrate(self, tokens: int, seconds: float) -> None:
        """A step timed at load (runner.calibrate): measured as any step, and its size stays
        on the curve however long no step of it runs (speculation weighs sizes that plain
        decoding never reaches)."""
        self.observe(tokens, seconds)
        bucket = self._buckets.get(tokens.bit_length() - 1)
        if bucket is not None:
            bucket.calibrated = True
        self._curve = None

    def curve(self) -> list[tuple[float, float]]:
        if self._curve is None:
            fresh = self._seen - self.stale_after
            self._curve = [b.centroid() for _, b in sorted(self._buckets.items())
                           if b.last_seen > fresh or b.calibrated]  # fmt: skip
        return list(self._curve)

    def predict(self, tokens: int) -> float:
        """A step's seconds at this size: on the measured curve, else by the linear fit."""
        points = self.curve()
        if not points:
            return self.linear.predict(tokens)
        slope = self.linear.per_token
        n0, t0 = points[0]
        if tokens <= n0:
            return max(0.0, t0 - slope * (n0 - tokens))
        for n1, t1 in points[1:]:
            if tokens <= n1:
                return t0 + (t1 - t0) * (tokens - n0) / (n1 - n0)
            n0, t0 = n1, t1
        return t0 + slope * (tokens - n0)

    def largest_within(self, seconds: float, limit: int) -> int:
        """The largest step (at most `limit` tokens) predicted to take at most `seconds`; 0 if
        none does. The curve need not rise everywhere: a larger step that costs less than a
        smaller one (another kernel, a better-filled batch) is found all the same."""
        points = [(n, t) for n, t in self.curve() if n < limit]
        slope = self.linear.per_token
        if not points:
            best = (seconds - self.linear.overhead) / slope
            return max(0, min(limit, int(best)))
        points.append((limit, self.predict(limit)))
        n0, t0 = points[0]
        best = max(0.0, n0 - (t0 - seconds) / slope) if t0 > seconds else n0
        for n1, t1 in points[1:]:
            if t1 <= seconds:
                best = n1
            elif t0 <= seconds:
                best = max(best, n0 + (seconds - t0) * (n1 - n0) / (t1 - t0))
            n0, t0 = n1, t1
        return max(0, min(limit, int(best)))


@dataclass(slots=True)
class StepError:
    """How far steps land from their prediction: the ratio actual / predicted of the recent
    steps, and the headroom it leaves (7. above)."""

    prior: float = 0.8  # the headroom until ERROR_SAMPLES steps are measured
    ratios: deque = field(default_factory=lambda: deque(maxlen=ERROR_WINDOW))
    # The headroom as of the last observation: it changes only then, and the budget reads it
    # many times a step (every limit, fit and room).
    _headroom: float | None = None

    def observe(self, predicted: float, actual: float) -> None:
        if predicted > 0 and actual > 0:
            self.ratios.append(actual / predicted)
            self._headroom = None

    def quantile(self) -> float | None:
        """The ERROR_QUANTILE of actual / predicted; None until enough steps are measured."""
        if len(self.ratios) < ERROR_SAMPLES:
            return None
        ordered = sorted(self.ratios)
        return ordered[min(len(ordered) - 1, int(ERROR_QUANTILE * len(ordered)))]

    @property
    def headroom(self) -> float:
        """The share of its target a step is planned to take."""
        if self._headroom is None:
            error = self.quantile()
            low, high = HEADROOM
            self._headroom = self.prior if error is None else min(high, max(low, 1.0 / error))
        return self._headroom


class TokenBudget:
    def __init__(
        self,
        itl_target: float,  # seconds: steps that carry an interactive decoding stream
        max_batch: int,  # the context's n_batch: the most tokens one llama_decode call takes
        *,
        background_itl_target: float = 1.0,  # seconds: steps whose streams are all background
        min_chunk: int = 1,  # a prefill always advances by at least this much: nothing starves
        starved_chunk: int = 32,  # the prompt's share when no target can be met (tokens())
        safety: float = 0.8,  # the headroom until the steps' own error is measured (7.)
        chunked: bool = True,  # False: whole prompts in one step (the baseline)
        cost: StepCostModel | None = None,  # the linear fit's priors, until steps are measured
    ):
        self.itl_target = itl_target
        self.max_batch = max_batch
        self.background_itl_target = background_itl_target
        self.min_chunk = min_chunk
        self.starved_chunk = starved_chunk
        self.error = StepError(prior=safety)
        self.chunked = chunked
        self.times = StepTimes(linear=cost or StepCostModel())
        self.verify_times = StepTimes()  # steps that verify drafts (9. above)
        self._between: deque[float] = deque(maxlen=BETWEEN_WINDOW)
        self._between_median = 0.0  # as of the last gap observed (read many times a step)

    @property
    def safety(self) -> float:
        """The share of the target a step's run is planned to take (7. above)."""
        return self.error.headroom

    @property
    def between_steps(self) -> float:
        """The median measured time between two runs (6. above); 0 until measured."""
        return self._between_median

    def observe_between(self, seconds: float) -> None:
        """The time from one step's run to the next's, while there was work all along."""
        if seconds >= 0:
            self._between.append(seconds)
            self._between_median = statistics.median(self._between)

    def limit(self, interactive: bool) -> float:
        """The seconds a step's run may take: its target less the work between runs, with the
        headroom its measured error leaves."""
        return max(0.0, self.target(interactive) - self.between_steps) * self.safety

    @property
    def cost(self) -> StepCostModel:
        """The linear fit (what the dashboard shows as the step cost)."""
        return self.times.linear

    @cost.setter
    def cost(self, model: StepCostModel) -> None:
        self.times.linear = model

    def target(self, interactive: bool) -> float:
        """The step's target: the ITL target while a person reads a stream in it, else the
        time of a step at the cost curve's knee, within the loose background target (8.)."""
        if interactive:
            return self.itl_target
        return max(self.itl_target, min(self.background_itl_target, self.knee_seconds()))

    def knee_seconds(self) -> float:
        """A step's time at the knee of the measured cost curve (8. above): the smallest size
        whose cost per token is within KNEE_SLACK of the cheapest measured within the loose
        target; the loose target itself until sizes are measured."""
        loose = self.background_itl_target
        points = [(n, t) for n, t in self.times.curve() if 0 < t <= loose and n >= 1]
        if len(points) < 2:
            return loose
        # The largest size the loose target allows, as the linear fit extends the curve: where
        # it promises a cheaper token than any measured, the knee moves there and the steps
        # sized by it measure whether it holds (on a GPU the curve flattens far beyond the
        # sizes the decodes alone reach).
        largest = self.times.largest_within(loose, self.max_batch)
        if largest > points[-1][0]:
            points.append((largest, self.times.predict(largest)))
        cheapest = min(t / n for n, t in points)
        for n, t in points:
            if t / n <= cheapest * (1 + KNEE_SLACK):
                return t
        return loose

    def tokens(
        self, decoding: int, interactive: bool = True, *, reserved_s: float = 0.0,
        guard: bool = True,
    ) -> int:  # fmt: skip
        """How many tokens the next step may carry, given how many sequences are decoding,
        whether any of them is interactive, and `reserved_s` seconds the step spends besides
        its tokens (restoring kept prompts). `guard=False` leaves the starvation guard out: the
        room of work that may wait (a background prompt beside a person's stream), which
        gets only what fits the target."""
        if decoding == 0 or not self.chunked:
            return self.max_batch
        target = self.limit(interactive) - reserved_s
        allowed = self.times.largest_within(target, self.max_batch) if target > 0 else 0
        floor = decoding + self.min_chunk
        if allowed < decoding:
            if not guard:
                return decoding
            # Even the decodes alone overrun the target (an overloaded box, or a model too big
            # for it): holding prompts to min_chunk would still miss the target and starve
            # them (seen on a loaded 2-core box: 0.7 s decode steps, a 1600-token prompt read
            # one token per step). Share the step instead: the prompt may cost about as much
            # as the decodes, so streams slow by about half while it is read. Until steps of
            # different sizes have shown what a prompt token costs (decode-only steps cannot),
            # a starved_chunk is tried: on a CPU a few dozen prompt tokens cost about one
            # decode step, and the step it makes teaches the cost model the slope.
            if self.cost.fitted:
                share = int(self.times.predict(decoding) / self.cost.per_token)
            else:
                share = self.starved_chunk
            allowed = decoding + max(self.min_chunk, share)
        elif not guard:
            return min(self.max_batch, allowed)
        return min(self.max_batch, max(floor, allowed))  # a step never exceeds n_batch

    def background_tokens(self) -> int:
        """The tokens of a step that reads background prompts with nobody decoding: a
        background step's (8.), not the whole batch, so a person who comes meanwhile waits for
        a step at the knee only."""
        if not self.chunked:
            return self.max_batch
        limit = self.limit(False)
        return max(self.min_chunk, self.times.largest_within(limit, self.max_batch))

    def seconds_per_prompt_token(self) -> float:
        """What reading a prompt costs per token at the best batch size measured: the price
        of recomputing a prefix instead of restoring it (inference.engine.tiers.costs)."""
        return self.times.predict(self.max_batch) / self.max_batch

    def fits(self, tokens: int, interactive: bool = True) -> bool:
        """Whether a step of this many tokens is predicted to meet its target."""
        return self.times.predict(tokens) <= self.limit(interactive)

    def observe(self, tokens: int, seconds: float, predicted: float | None = None, *,
                verified: bool = False) -> None:  # fmt: skip
        """Record a step of `tokens` tokens (decodes and prompt chunks alike) that took
        `seconds`, `predicted` before it ran: its curve (`verified`: it verified drafts, 9.)
        learns from it, and the error from how far it landed from its prediction."""
        if predicted is not None:
            self.error.observe(predicted, seconds)
        (self.verify_times if verified else self.times).observe(tokens, seconds)

    def calibrate(self, tokens: int, seconds: float) -> None:
        """A step timed at load (runner.calibrate, logits at every position): 9. above."""
        self.verify_times.calibrate(tokens, seconds)
        self.times.observe(tokens, seconds)

    def predict_verified(self, tokens: int) -> float:
        """A step's seconds at this size when it verifies drafts (9.): on their own curve once
        it has points, never below a plain step's."""
        plain = self.times.predict(tokens)
        if not self.verify_times.curve():
            return plain
        return max(plain, self.verify_times.predict(tokens))
