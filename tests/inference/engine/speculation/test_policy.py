"""How far streams speculate: by measured acceptance against the measured cost of a step."""

from types import SimpleNamespace

import pytest

from inference.engine.speculation.lookup import TokenHistory
from inference.engine.speculation.policy import PRIOR, Speculation, Stream


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
