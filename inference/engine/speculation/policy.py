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
   (a GPU, a model bound by memory), predictable text gets long drafts sooner. A step's time
   counts the work between two steps too (budget.between_steps): a token a draft adds saves a
   whole step's turn, run and handover both.
4. The payoff, measured. Allocation trusts predictions; the payoff checks them. After each step
   that verified drafts, what they saved (their kept tokens, each a decoding stream's share of
   a step without drafts and the work between steps) is weighed against what they cost (the
   step's measured time over its predicted time without them), in a ledger that forgets within
   ~10 such steps. While the ledger is negative (drafts lately cost more than they saved, as
   prose did on a 2-core CPU), "auto" drafts for nobody but once every PROBE_EVERY steps, at
   most PROBE_DRAFT tokens a stream, so the ledger learns cheaply when they start paying
   again; shadow drafts go on learning meanwhile.
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
LEDGER_MEMORY = 0.9  # the weight of the payoff's past per step that verified drafts (4.)
PROBE_DRAFT = 2  # the most a stream drafts in a probe while drafts have not paid (4.)


@dataclass(slots=True)
class Payoff:
    """What drafts saved less what they cost, in seconds, over the recent steps that verified
    them (4. above): negative, drafting has lately made the box slower."""

    ledger: float = 0.0
    kept: int = 0  # draft tokens kept in the step being settled (Speculation.came adds them)
    since_probe: int = 0  # allocations since drafts were last allowed while the ledger is negative

    def settle(self, undrafted_s: float, actual_s: float, decodes: int, between_s: float) -> None:
        """A step that verified drafts ran `actual_s` (a draft model's drafting for it
        included); without them it was predicted to run `undrafted_s`, for `decodes` decoding
        streams, with `between_s` between two steps."""
        saved = self.kept * (undrafted_s + between_s) / max(1, decodes)
        self.ledger = self.ledger * LEDGER_MEMORY + saved - (actual_s - undrafted_s)
        self.kept = 0

    @property
    def paying(self) -> bool:
        return self.ledger >= 0.0


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
        self.payoff = Payoff()  # 4.: whether drafting has lately paid, measured

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
            self.payoff.kept += kept
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
        PROBE_EVERY steps, so its acceptance (and the draft model's cost) stays measured; while
        drafts have lately not paid (4.), it is asked only then."""
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
        if not self.payoff.paying:  # drafts have lately cost more than they saved (4.)
            return 0
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

    def settle(self, undrafted_s: float, actual_s: float, decodes: int,
               between_s: float = 0.0) -> None:  # fmt: skip
        """4.: a step that verified drafts ran `actual_s` (its tokens were given to `came`
        first); without the drafts it was predicted to run `undrafted_s`."""
        self.payoff.settle(undrafted_s, actual_s, decodes, between_s)

    def allocate(self, offers: list[tuple[object, list[int]]], predict, step_tokens: int,
                 decodes: int, limit_s: float, between_s: float = 0.0,
                 undrafted_s: float | None = None) -> dict[int, int]:  # fmt: skip
        """How many of its offered draft tokens each stream feeds (by index into `offers`):
        `predict(n)` is the seconds of a step of n tokens that verifies drafts, `undrafted_s`
        the step's without any (a plain step's, on its own curve: budget.py 9.; by default
        `predict(step_tokens)`), `step_tokens` the step's tokens without drafts, `decodes` its
        decoding streams (one token each, at least), `limit_s` the most the step may take,
        `between_s` the work between two steps. Streams offered nothing
        remember a shadow draft (2.); while drafts have not paid lately (4.) nobody drafts but
        once every PROBE_EVERY steps.

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
        probing = self.mode == "auto" and not self.payoff.paying
        if probing:
            self.payoff.since_probe += 1
            if self.payoff.since_probe < PROBE_EVERY:
                return given
            # A probe costs little: a short draft says whether drafting pays again as well as
            # a long one would, and a failed long one cost the JSON task its margin over off.
            offers = [(request, offered[:PROBE_DRAFT]) for request, offered in offers]
        self.payoff.since_probe = 0

        # expected[n][k]: the tokens stream n expects from a draft of k, a + a^2 + ... + a^k
        # (built once: this runs every step, for every decoding stream).
        expected = []
        for request, offered in offers:
            a, sums, power = request.speculation.rate, [0.0], 1.0
            for _ in offered:
                power *= a
                sums.append(sums[-1] + power)
            expected.append(sums)

        order = sorted(range(len(offers)), key=lambda n: -offers[n][0].speculation.rate)
        for _ in range(2):
            for n in order:
                others_k = sum(given.values()) - given[n]
                others_e = sum(expected[m][given[m]] for m in given if m != n)
                run_s = (predict(step_tokens + others_k) if others_k or undrafted_s is None
                         else undrafted_s)  # fmt: skip
                base_s = max(run_s + between_s, 1e-6)
                base = (decodes + others_e) / base_s
                best_k, best = 0, base
                # No draft of any length can beat the margin when even all it may expect,
                # at the cost of one token more, does not (prose: a stream's usual case).
                most = (decodes + others_e + expected[n][-1]) / max(
                    predict(step_tokens + others_k + 1) + between_s, 1e-6)
                if self.mode != "always" and most <= (1 + MARGIN) * base:
                    given[n] = 0
                    continue
                for k in range(1, len(offers[n][1]) + 1):
                    run_s = predict(step_tokens + others_k + k)
                    if run_s > limit_s:
                        break
                    rate = (decodes + others_e + expected[n][k]) / max(run_s + between_s, 1e-6)
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
                "paying": self.payoff.paying, "payoff_s": round(self.payoff.ledger, 4),
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
