"""The per-step token budget, derived from an ITL target and the measured cost of a step.

A step's wall time is modelled as `overhead + per_token * tokens` and fitted online by least
squares with exponential forgetting, so the model follows the machine (and the growing attention
cost of a long prompt) within a few steps. While anyone is decoding, a step may only take as long
as the ITL target allows; with nobody decoding, prefill runs at full batch size.
"""

from dataclasses import dataclass


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
class TokenBudget:
    itl_target: float  # seconds
    max_batch: int  # the context's n_batch: the most tokens one llama_decode call takes
    min_chunk: int = 1  # a prefill always advances by at least this much, so nothing starves
    # The prompt's share of a step when the target cannot be met at all (see tokens()).
    starved_chunk: int = 32
    safety: float = 0.8  # headroom for noise and the work between steps
    chunked: bool = True  # False: whole prompts in one step (the baseline it is measured against)
    cost: StepCostModel | None = None
    # What mixed steps (decodes plus prompt chunks) measurably allow; None until one ran.
    mixed: float | None = None

    def __post_init__(self) -> None:
        if self.cost is None:
            self.cost = StepCostModel()

    def tokens(self, decoding: int) -> int:
        """How many tokens the next step may carry, given how many sequences are decoding."""
        if decoding == 0 or not self.chunked:
            return self.max_batch
        if self.mixed is not None:
            allowed = self.mixed
        else:
            allowed = (self.itl_target * self.safety - self.cost.overhead) / self.cost.per_token
        floor = decoding + self.min_chunk
        if allowed < decoding:
            # Even the decodes alone overrun the target (an overloaded box, or a model too big
            # for it): holding prompts to min_chunk would still miss the target and starve
            # them (seen on a loaded 2-core box: 0.7 s decode steps, a 1600-token prompt read
            # one token per step). Share the step instead: the prompt may cost about as much
            # as the decodes, so streams slow by about half while it is read. Until steps of
            # different sizes have shown what a prompt token costs (decode-only steps cannot),
            # a starved_chunk is tried: on a CPU a few dozen prompt tokens cost about one
            # decode step, and the step it makes teaches the cost model the slope.
            if self.cost.fitted:
                share = int(self.cost.predict(decoding) / self.cost.per_token)
            else:
                share = self.starved_chunk
            allowed = decoding + max(self.min_chunk, share)
        return min(self.max_batch, max(floor, int(allowed)))  # a step never exceeds n_batch

    def observe(self, tokens: int, seconds: float, decoding: int = 0) -> None:
        """Record a step. Steps that carried decodes and prompt chunks together also correct
        the budget directly: the linear model cannot follow a cost per token that rises as a
        prompt gets deeper (attention) and that is higher in small batches than in large
        ones, so the budget scales the last mixed step's size to the target, smoothed."""
        self.cost.observe(tokens, seconds)
        if decoding and tokens > decoding and seconds > 0:
            fitting = tokens * self.itl_target * self.safety / seconds
            self.mixed = fitting if self.mixed is None else 0.5 * (self.mixed + fitting)
