"""How far streams speculate: by measured acceptance against the measured cost of a step."""

from types import SimpleNamespace

import pytest

from inference.engine.speculation.lookup import TokenHistory
from inference.engine.speculation.policy import (
    MODEL_DRAFT,
    PRIOR,
    PROBE_DRAFT,
    PROBE_EVERY,
    Speculation,
    Stream,
)


def stream(acceptance: float) -> SimpleNamespace:
    return SimpleNamespace(speculation=Stream(TokenHistory([], 8), acceptance=acceptance))


def linear(overhead: float, per_token: float):
    return lambda n: overhead + per_token * n


def test_predictable_text_gets_drafts_where_extra_tokens_are_cheap():
    spec = Speculation()
    given = spec.allocate([(stream(0.9), [1] * 8)], linear(0.010, 0.0005), 1, 1, limit_s=0.08)
    assert given[0] >= 5


def test_nothing_is_drafted_where_each_token_costs_a_step():
    spec = Speculation()
    given = spec.allocate([(stream(0.6), [1] * 8)], linear(0.0, 0.010), 1, 1, limit_s=0.08)
    assert given[0] == 0


def test_drafts_never_push_a_step_past_its_limit():
    spec = Speculation()
    given = spec.allocate([(stream(0.99), [1] * 8)], linear(0.010, 0.005), 1, 1, limit_s=0.026)
    assert 0 < given[0] and 0.010 + 0.005 * (1 + given[0]) <= 0.026


def test_the_likeliest_stream_gets_the_drafts_first():
    spec = Speculation()
    sure, unsure = stream(0.95), stream(0.3)
    given = spec.allocate([(unsure, [1] * 4), (sure, [1] * 4)], linear(0.01, 0.002), 2, 2,
                          limit_s=0.08)  # fmt: skip
    assert given[1] > given[0]


def test_off_drafts_nothing():
    given = Speculation("off").allocate([(stream(1.0), [1] * 8)], linear(0.01, 0.0), 1,
                                                1, limit_s=1.0)  # fmt: skip
    assert given == {0: 0}


def test_a_stream_learns_from_the_draft_it_did_not_make():
    spec = Speculation()
    request = stream(PRIOR)
    request.prompt_len, request.max_new_tokens, request.prompt_ids = 0, 8, []
    for _ in range(20):
        spec.allocate([(request, [7, 8])], linear(0.0, 0.010), 1, 1, limit_s=0.08)
        spec.came(request, [7], [])  # the shadow draft's first token came: a hit
    assert request.speculation.acceptance > 0.95 and spec.drafted == 0
    for _ in range(20):
        spec.allocate([(request, [7, 8])], linear(0.0, 0.010), 1, 1, limit_s=0.08)
        spec.came(request, [3], [])
    assert request.speculation.acceptance < 0.05


@pytest.mark.parametrize(("draft", "tokens", "kept"),
                         [([1, 2, 3], [1, 2, 3, 4], 3), ([1, 2, 3], [1, 9], 1), ([1], [5], 0)])
def test_a_verified_draft_counts_what_was_kept(draft, tokens, kept):
    spec = Speculation()
    request = stream(0.5)
    spec.came(request, tokens, draft)
    assert (spec.drafted, spec.accepted) == (len(draft), kept)
    assert request.speculation.history.length == len(tokens)


# A step's seconds by size for one sequence, measured on the 2-core CPU (not convex: two
# tokens cost twice one, sixteen 6.6 times).
MEASURED = {1: 0.0082, 2: 0.0163, 3: 0.0178, 4: 0.0200, 6: 0.0299, 8: 0.0331, 12: 0.0459,
            16: 0.0542, 24: 0.0906, 32: 0.1181}  # fmt: skip


def measured(n: int) -> float:
    sizes = sorted(MEASURED)
    below = max((s for s in sizes if s <= n), default=1)
    above = min((s for s in sizes if s >= n), default=sizes[-1])
    if above == below:
        return MEASURED[below]
    t0, t1 = MEASURED[below], MEASURED[above]
    return t0 + (t1 - t0) * (n - below) / (above - below)


def test_copied_text_gets_a_long_draft_where_one_token_more_would_not_pay():
    spec = Speculation()
    given = spec.allocate([(stream(0.97), [1] * 32)], measured, 1, 1, limit_s=1.0)
    assert given[0] >= 12  # past the costly second token, into the cheap region


def test_prose_gets_nothing_on_the_same_cpu():
    spec = Speculation()
    assert spec.allocate([(stream(0.5), [1] * 32)], measured, 1, 1, limit_s=1.0) == {0: 0}


def test_the_itl_target_still_bounds_a_long_draft():
    spec = Speculation()
    given = spec.allocate([(stream(0.97), [1] * 32)], measured, 1, 1, limit_s=0.08)
    assert given[0] > 0 and measured(1 + given[0]) <= 0.08


# --- when to ask a draft model -------------------------------------------------------------------


def decoding(text: list[int], model_acceptance: float = PRIOR) -> SimpleNamespace:
    history = TokenHistory(text, len(text) + 64)
    return SimpleNamespace(speculation=Stream(history, model_acceptance=model_acceptance))


def test_a_draft_model_is_not_asked_where_the_text_drafts_itself():
    spec = Speculation()
    spec.model_round_s = 0.0001
    assert spec.model_draft_length(decoding([1, 2, 3, 9, 1, 2, 3]), linear(0.01, 0.0), 8) == 0


def test_a_draft_model_is_tried_before_its_cost_is_known():
    spec = Speculation()
    assert spec.model_draft_length(decoding([5, 6, 7]), linear(0.01, 0.0), 20) == MODEL_DRAFT


def test_a_cheap_draft_model_that_guesses_well_drafts_for_a_step_that_costs_the_same_for_more():
    spec = Speculation()
    spec.model_round_s = 0.001
    assert spec.model_draft_length(decoding([5, 6, 7], 0.9), linear(0.02, 0.0001), 20) >= 4


def test_a_draft_model_that_guesses_badly_is_probed_only_now_and_then():
    spec = Speculation()
    spec.model_round_s = 0.001
    request = decoding([5, 6, 7], 0.05)
    asked = [spec.model_draft_length(request, linear(0.0, 0.010), 20) for _ in range(64)]
    assert sum(1 for k in asked if k) == 64 // PROBE_EVERY


def test_the_draft_models_guesses_are_offered_when_the_text_has_none():
    spec = Speculation()
    request = decoding([5, 6, 7])
    request.cache_partition = None
    spec.model_drafted([request], [[8, 9]], 0.002)
    assert spec.proposal(request, 8) == [8, 9] and request.speculation.from_model
    assert spec.model_round_s == 0.001
    spec.came(request, [8, 4], [8, 9])  # one kept, then the model said 4
    assert request.speculation.model_acceptance != PRIOR
    assert request.speculation.acceptance == PRIOR
    assert request.speculation.model_draft == []  # used once


# --- the payoff, measured (4.) -------------------------------------------------------------------


def drafted_step(spec: Speculation, request, *, kept: int, undrafted_s: float, actual_s: float):
    """One step in which `request` verified a draft of 8 and kept `kept` of it."""
    draft = [1] * 8
    spec.came(request, [1] * kept + [2], draft)
    spec.settle(undrafted_s, actual_s, decodes=1, between_s=0.0)


def test_drafts_that_cost_more_than_they_save_stop_within_a_few_steps_and_are_probed_now_and_then():
    spec = Speculation()
    request = stream(0.9)
    # Each step with a draft ran 40 ms over its plain 10 ms and kept 2 tokens (worth 20 ms).
    for _ in range(3):
        drafted_step(spec, request, kept=2, undrafted_s=0.010, actual_s=0.050)
    assert not spec.payoff.paying
    offers = [(request, [1] * 8)]
    allowed = [spec.allocate(offers, linear(0.010, 0.0005), 1, 1, limit_s=0.1)[0]
               for _ in range(2 * PROBE_EVERY)]  # fmt: skip
    assert sum(1 for k in allowed if k) == 2  # a probe once in PROBE_EVERY steps, no more
    assert max(allowed) == PROBE_DRAFT  # and a short one: a failed probe costs little
    assert spec.reading()["paying"] is False


def test_drafts_that_save_more_than_they_cost_go_on():
    spec = Speculation()
    request = stream(0.9)
    for _ in range(5):  # 8 tokens kept, each worth a 10 ms step, for 5 ms more in the step
        drafted_step(spec, request, kept=8, undrafted_s=0.010, actual_s=0.015)
    assert spec.payoff.paying and spec.payoff.ledger > 0
    given = spec.allocate([(request, [1] * 8)], linear(0.010, 0.0005), 1, 1, limit_s=0.1)
    assert given[0] > 0


def test_a_probe_that_pays_brings_drafting_back():
    spec = Speculation()
    request = stream(0.9)
    drafted_step(spec, request, kept=0, undrafted_s=0.010, actual_s=0.030)
    assert not spec.payoff.paying
    drafted_step(spec, request, kept=8, undrafted_s=0.010, actual_s=0.012)
    assert spec.payoff.paying


def test_the_work_between_steps_counts_for_a_draft():
    # Each token costs its own 10 ms in the run: without the work between steps a draft
    # never pays; with 20 ms between steps, a token that rides along saves that much.
    spec = Speculation()
    plain = spec.allocate([(stream(0.9), [1] * 8)], linear(0.0, 0.010), 1, 1, limit_s=1.0)
    assert plain[0] == 0
    spec = Speculation()
    given = spec.allocate([(stream(0.9), [1] * 8)], linear(0.0, 0.010), 1, 1, limit_s=1.0,
                          between_s=0.020)  # fmt: skip
    assert given[0] > 0


def test_the_draft_is_weighed_against_a_plain_step_on_its_own_curve():
    # A plain step of one token costs 5 ms, a verified one of any size up to 9 costs 20:
    # against the plain step, a draft of 8 at 0.5 kept a token each pays nothing.
    spec = Speculation()
    given = spec.allocate([(stream(0.5), [1] * 8)], lambda n: 0.020, 1, 1, limit_s=1.0,
                          undrafted_s=0.005)  # fmt: skip
    assert given[0] == 0
    assert Speculation().allocate([(stream(0.5), [1] * 8)], lambda n: 0.020, 1, 1,
                                  limit_s=1.0)[0] > 0  # fmt: skip


def test_while_drafts_have_not_paid_a_draft_model_that_guesses_well_is_only_probed():
    spec = Speculation()
    spec.model_round_s = 0.001
    spec.payoff.ledger = -0.05  # its drafts lately cost more than they saved, measured
    request = decoding([5, 6, 7], 0.9)
    asked = [spec.model_draft_length(request, linear(0.02, 0.0001), 20) for _ in range(64)]
    assert sum(1 for k in asked if k) == 64 // PROBE_EVERY
