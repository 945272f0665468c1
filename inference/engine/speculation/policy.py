"""How far each decoding stream speculates in a step, from what it has shown and what steps cost.

1. Drafts. A stream's draft is what its own text predicts (lookup.draft), else, where the
   model has one, what its draft model writes (inference.engine.draft_model), else what its
   partition's earlier answers predict (table.NgramTable). The first and last cost a lookup;
   a draft model's costs a small model's steps, taken before the step only where its expected
   saving beats that cost (model_draft_length), and probed now and then to learn it.
2. Acceptance. Each stream keeps an estimate of the chance that a drafted token is kept, given
   the ones before it were (a moving average over what happened). It learns even while it does
   not speculate: the draft it would have made is checked against the token that came (a
   "shadow" draft costs a lookup, nothing in the step), so a stream whose text becomes
   predictable (an answer that starts quoting) starts speculating, and prose never pays to
   find out that it is not.
3. Allocation. Each stream's draft length is the one that gives the step the most expected
   tokens per second (the step's time read off the measured cost of a step by size,
   budget.StepTimes, calibrated at load: runner.calibrate) while the step stays inside its
   budget (the ITL target while a person reads a stream). With k drafts kept with chance a each
   in turn, a stream expects 1 + a + a^2 + ... + a^k tokens for its 1 + k tokens of step. On
   the 2-core CPU measured, a step of 16 tokens costs 6.6 times one of one token: copied text
   (a near 1) gets long drafts, free prose none; where a step costs little more for many tokens
   (a GPU, a model bound by memory), predictable text gets long drafts sooner.
"""

from dataclasses import dataclass, field

from inference.engine.speculation.lookup import TokenHistory, draft
from inference.engine.speculation.table import NgramTable

MAX_DRAFT = 32  # tokens drafted for one stream in one step, at most
PRIOR = 0.3  # a stream's acceptance before it has shown any
SMOOTHING = 0.2  # weight of the newest observation in a stream's acceptance
# A draft must raise the step's expected tokens per second by this much: more than the noise of
# the step-cost curve, so a borderline draft (a JSON answer's repeated keys) is not a loss.
MARGIN = 0.15
SHADOW = 4  # tokens of a shadow draft checked against what comes
MODEL_DRAFT = 8  # tokens a draft model writes for one stream in one step, at most
PROBE_EVERY = 16  # a stream the draft model does not pay for is drafted for once in this many steps


@dataclass(slots=True)
class Stream:
    """One request's speculation: its text so far, its acceptance, its counts."""

    history: TokenHistory
    acceptance: float = PRIOR  # of drafts from its text and its partition's table
    model_acceptance: float = PRIOR  # of its draft model's drafts
    shadow: list[int] = field(default_factory=list)  # the draft it did not make last step
    model_draft: list[int] = field(default_factory=list)  # the draft model's, for this step
    from_model: bool = False  # this step's offer (and shadow) is the draft model's
    since_probe: int = 0  # steps since the draft model last drafted for it
    drafted: int = 0  # draft tokens verified for it
    accepted: int = 0  # of those, kept

    def observe(self, tries: int, kept: int) -> None:
        """`tries` drafted tokens reached (each after the ones before it were kept), `kept`;
        of the draft model's draft when from_model."""
        for n in range(tries):
            hit = 1.0 if n < kept else 0.0
            if self.from_model:
                self.model_acceptance += SMOOTHING * (hit - self.model_acceptance)
            else:
                self.acceptance += SMOOTHING * (hit - self.acceptance)

    @property
    def rate(self) -> float:
        """The acceptance that applies to this step's offer."""
        return self.model_acceptance if self.from_model else self.acceptance


MODES = ("off", "auto", "always")  # SPECULATIVE_DECODING


class Speculation:
    def __init__(self, mode: str = "auto", *, table: NgramTable | None = None,
                 max_draft: int = MAX_DRAFT):  # fmt: skip
        """`mode`: "auto" (3. above), "always" (every draft offered, as far as the step's
        budget allows, paying or not: benchmarks and tests of verification), "off"."""
        if mode not in MODES:
            raise ValueError(f"speculative decoding is one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self.enabled = mode != "off"
        self.table = table if table is not None else NgramTable()
        self.max_draft = max_draft
        self.drafted = 0  # totals since load, as llama-server's draft_n and draft_n_accepted
        self.accepted = 0
        self.drafts = 0  # verifications that carried a draft (spec_decode_num_drafts)
        self.verify_tokens = 0  # draft tokens fed in steps
        self.model_drafts = 0  # streams the draft model drafted for
        self.model_seconds = 0.0  # spent drafting with the draft model
        self.model_round_s: float | None = None  # one draft-model decode, measured (average)

    # --- a stream's life ---------------------------------------------------------------------

    def start(self, request) -> None:
        capacity = request.prompt_len + request.max_new_tokens + self.max_draft + 1
        request.speculation = Stream(TokenHistory(text_after_images(request.prompt_ids), capacity))

    def proposal(self, request, limit: int) -> list[int]:
        """1. What the stream would draft now, at most `limit` tokens."""
        stream: Stream = request.speculation
        if stream is None or limit <= 0:
            return []
        stream.from_model = False
        own = draft(stream.history, limit)
        if own:
            return own
        if stream.model_draft:
            stream.from_model = True
            return stream.model_draft[:limit]
        recent = stream.history.ids[max(0, stream.history.length - 8) : stream.history.length]
        return self.table.draft(request.cache_partition, recent.tolist(), limit)

    def came(self, request, tokens: list[int], draft: list[int]) -> None:
        """2. The tokens a step gave `request` (its draft, if it had one, verified): what it
        learns about its acceptance, its text extended, its counts."""
        stream: Stream = request.speculation
        if stream is None:
            return
        if draft:
            kept = _kept(draft, tokens)
            stream.observe(min(len(draft), kept + 1), kept)
            stream.drafted += len(draft)
            stream.accepted += kept
            self.drafted += len(draft)
            self.accepted += kept
            self.drafts += 1
            self.verify_tokens += len(draft)
        elif stream.shadow:
            kept = _kept(stream.shadow, tokens)
            stream.observe(min(len(stream.shadow), kept + 1, len(tokens)), kept)
        for token in tokens:
            stream.history.append(token)
        stream.shadow = []
        stream.model_draft = []
        stream.from_model = False

    # --- the draft model -----------------------------------------------------------------------

    def model_draft_length(self, request, predict, room: int) -> int:
        """How many tokens the draft model should write for `request` before this step (0:
        none), `room` at most. None where its own text already drafts (free); else the length
        whose expected saving most exceeds its cost: k kept with chance a each in turn save
        a + ... + a^k one-token steps (`predict(1)` seconds each) for k draft-model decodes
        and k more tokens in the step. A stream it does not pay for is drafted for once every
        PROBE_EVERY steps, so its acceptance (and the draft model's cost) stays measured."""
        stream: Stream = request.speculation
        if stream is not None:
            stream.model_draft = []  # one from a step it was not in is stale
        room = min(room, MODEL_DRAFT, self.max_draft)
        if not self.enabled or stream is None or room <= 0 or draft(stream.history, 1):
            return 0
        stream.since_probe += 1
        if self.mode == "always" or self.model_round_s is None or stream.since_probe >= PROBE_EVERY:
            stream.since_probe = 0
            return room
        one = predict(1)
        a = stream.model_acceptance
        best_k, best = 0, 0.0
        for k in range(1, room + 1):
            saved = sum(a**i for i in range(1, k + 1)) * one
            cost = k * self.model_round_s + predict(1 + k) - one
            if saved - cost > best * (1 + MARGIN) and saved > (1 + MARGIN) * cost:
                best_k, best = k, saved - cost
        if best_k:
            stream.since_probe = 0
        return best_k

    def model_drafted(self, requests: list, drafts: list[list[int]], seconds: float,
                      round_s: float | None = None) -> None:  # fmt: skip
        """What the draft model wrote for `requests` before this step, in `seconds`; `round_s`:
        what one drafting decode took (a stream's reading of its new text, usually a token or
        two, costs about one), else reckoned as `seconds` over the longest draft."""
        for request, tokens in zip(requests, drafts, strict=True):
            request.speculation.model_draft = tokens
        rounds = max((len(t) for t in drafts), default=0)
        self.model_drafts += sum(1 for t in drafts if t)
        self.model_seconds += seconds
        if rounds:
            per_round = round_s if round_s is not None else seconds / rounds
            self.model_round_s = per_round if self.model_round_s is None else (
                self.model_round_s + SMOOTHING * (per_round - self.model_round_s))  # fmt: skip

    def finished(self, request) -> None:
        """The answer is over: its partition's table learns what it said."""
        stream: Stream = request.speculation
        if stream is None or not request.output_ids:
            return
        context = text_after_images(request.prompt_ids[-3:]) + request.output_ids
        self.table.learn(request.cache_partition, context)
        request.speculation = None

    # --- 3. a step's drafts --------------------------------------------------------------------

    def allocate(self, offers: list[tuple[object, list[int]]], predict, step_tokens: int,
                 decodes: int, limit_s: float) -> dict[int, int]:  # fmt: skip
        """How many of its offered draft tokens each stream feeds (by index into `offers`):
        `predict(n)` is a step's seconds at n tokens, `step_tokens` the step's tokens without
        drafts, `decodes` its decoding streams (one token each, at least), `limit_s` the most
        the step may take. Streams offered nothing remember a shadow draft (2.).

        A step's cost by size is not convex on a CPU (one sequence: 2 tokens cost twice one,
        8 tokens four times, 16 tokens 6.6 times), so each stream's draft length is chosen
        among all its lengths, not grown a token at a time: the one that gives the step the
        most expected tokens per second, given the others' (two passes over the streams, the
        likeliest first); a length is taken only when it beats none by MARGIN."""
        given = dict.fromkeys(range(len(offers)), 0)
        if not self.enabled:
            return given
        for request, offered in offers:
            request.speculation.shadow = offered[:SHADOW]

        def expected(n: int, k: int) -> float:
            a = offers[n][0].speculation.rate
            return sum(a**i for i in range(1, k + 1))

        order = sorted(range(len(offers)), key=lambda n: -offers[n][0].speculation.rate)
        for _ in range(2):
            for n in order:
                others_k = sum(given.values()) - given[n]
                others_e = sum(expected(m, given[m]) for m in given if m != n)
                base_s = max(predict(step_tokens + others_k), 1e-6)
                base = (decodes + others_e) / base_s
                best_k, best = 0, base
                for k in range(1, len(offers[n][1]) + 1):
                    seconds = max(predict(step_tokens + others_k + k), 1e-6)
                    if seconds > limit_s:
                        break
                    rate = (decodes + others_e + expected(n, k)) / seconds
                    if self.mode == "always" or (rate > best and rate > (1 + MARGIN) * base):
                        best_k, best = k, rate
                given[n] = best_k
        for n, (request, _) in enumerate(offers):
            if given[n]:
                request.speculation.shadow = []
        return given

    def forget(self, partition: str | None = None, *, everything: bool = False) -> None:
        self.table.forget(partition, everything=everything)

    def reading(self) -> dict:
        return {"enabled": self.enabled, "mode": self.mode, "drafted": self.drafted,
                "accepted": self.accepted, "drafts": self.drafts,
                "verify_tokens": self.verify_tokens,
                "acceptance": self.accepted / self.drafted if self.drafted else None,
                "model_drafts": self.model_drafts,
                "model_seconds": round(self.model_seconds, 4),
                "table_contexts": self.table.contexts}  # fmt: skip


def text_after_images(ids: list[int]) -> list[int]:
    """The prompt's tokens after its last image: an image's positions hold pseudo ids
    (inference.engine.vision), which no draft may come from or hold, and which the draft
    model, whose history this is too, must never be fed."""
    for n in range(len(ids) - 1, -1, -1):
        if ids[n] < 0:
            return ids[n + 1 :]
    return ids


def _kept(draft: list[int], tokens: list[int]) -> int:
    """How many of a draft's tokens the step's tokens confirm, in order."""
    kept = 0
    for guess, token in zip(draft, tokens, strict=False):
        if guess != token:
            break
        kept += 1
    return kept
