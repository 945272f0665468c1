import random

import pytest

from inference.engine.budget import StepCostModel, TokenBudget


def feed(model: StepCostModel, overhead: float, per_token: float, steps: int, noise: float = 0.0,
         seed: int = 1) -> None:  # fmt: skip
    rng = random.Random(seed)
    for _ in range(steps):
        tokens = rng.choice([1, 2, 3, 4, 17, 33, 64, 128])
        seconds = (overhead + per_token * tokens) * (1 + rng.uniform(-noise, noise))
        model.observe(tokens, seconds)


def test_the_cost_model_converges_to_the_true_overhead_and_per_token_cost():
    model = StepCostModel()
    feed(model, overhead=0.004, per_token=0.0007, steps=40)
    assert model.overhead == pytest.approx(0.004, rel=1e-6)
    assert model.per_token == pytest.approx(0.0007, rel=1e-6)
    assert model.predict(100) == pytest.approx(0.074, rel=1e-6)


def test_the_cost_model_converges_despite_noisy_timings():
    model = StepCostModel()
    feed(model, overhead=0.02, per_token=0.001, steps=200, noise=0.05)
    assert model.overhead == pytest.approx(0.02, rel=0.25)
    assert model.per_token == pytest.approx(0.001, rel=0.1)


def test_the_cost_model_follows_a_change_of_machine_within_a_few_dozen_steps():
    model = StepCostModel()
    feed(model, overhead=0.01, per_token=0.002, steps=50)
    feed(model, overhead=0.005, per_token=0.0005, steps=60, seed=2)
    assert model.per_token == pytest.approx(0.0005, rel=0.02)
    assert model.overhead == pytest.approx(0.005, rel=0.05)


def test_without_spread_in_batch_sizes_the_rest_of_the_time_goes_to_the_tokens():
    model = StepCostModel(overhead=0.004, per_token=0.005)
    for _ in range(20):
        model.observe(1, 0.013)  # decode-only steps: one token each
    assert model.overhead == 0.004
    assert model.per_token == pytest.approx(0.009)


def test_without_spread_the_overhead_never_claims_more_than_half_a_step():
    model = StepCostModel(overhead=0.05, per_token=0.005)
    for _ in range(20):
        model.observe(1, 0.013)
    assert model.overhead == pytest.approx(0.0065)
    assert model.per_token == pytest.approx(0.0065)  # never near zero: no full-batch budget
    assert model.predict(1) == pytest.approx(0.013)


def test_empty_or_zero_time_observations_are_ignored():
    model = StepCostModel()
    model.observe(0, 0.5)
    model.observe(10, 0.0)
    assert (model.overhead, model.per_token) == (0.010, 0.005)


def test_with_nobody_decoding_the_budget_is_the_whole_batch():
    budget = TokenBudget(itl_target=0.01, max_batch=512)
    assert budget.tokens(0) == 512


def test_unchunked_the_budget_is_always_the_whole_batch():
    budget = TokenBudget(itl_target=0.01, max_batch=512, chunked=False)
    assert budget.tokens(3) == 512


def test_the_budget_fits_the_itl_target():
    budget = TokenBudget(0.05, 512, cost=StepCostModel(overhead=0.005, per_token=0.001))
    # 0.05 s * 0.8 safety = 0.04 s; (0.04 - 0.005) / 0.001 = 35 tokens
    assert budget.tokens(1) == 35
    assert budget.cost.predict(budget.tokens(1)) <= budget.itl_target


def test_a_target_that_even_the_decodes_overrun_still_leaves_the_prompt_a_share():
    # 0.02 s of overhead alone exceeds a 0.01 s target: nothing can meet it.
    budget = TokenBudget(0.01, 512, min_chunk=8, cost=StepCostModel(overhead=0.02, per_token=0.01))
    # Nothing measured yet says what a prompt token costs: a starved chunk is tried.
    assert budget.tokens(5) == 5 + 32
    feed(budget.cost, overhead=0.5, per_token=0.001, steps=40)
    assert budget.cost.fitted
    # Measured: the decodes cost 0.505 s; the prompt may cost as much, 505 tokens.
    assert budget.tokens(5) == 5 + 505


def test_a_starved_prompt_never_gets_less_than_the_floor():
    budget = TokenBudget(0.01, 512, min_chunk=8, starved_chunk=2,
                         cost=StepCostModel(overhead=0.02, per_token=0.01))  # fmt: skip
    assert budget.tokens(5) == 5 + 8


def test_the_budget_never_drops_below_one_token_per_decoder_plus_a_prompt_chunk():
    budget = TokenBudget(0.05, 512, min_chunk=8, cost=StepCostModel(overhead=0.03, per_token=0.002))
    # (0.04 - 0.03) / 0.002 = 5 tokens allowed, below the floor of 5 + 8 but the target is met
    # by the decodes alone: the floor holds.
    assert budget.tokens(5) == 13


def test_the_budget_never_exceeds_the_batch():
    budget = TokenBudget(1.0, 64, cost=StepCostModel(overhead=0.0, per_token=1e-6))
    assert budget.tokens(1) == 64
    assert budget.tokens(60) == 64  # the floor of 60 + 8 is capped too


def test_the_budget_shrinks_when_steps_get_slower_and_grows_when_they_get_faster():
    budget = TokenBudget(0.05, 512)
    feed(budget.cost, overhead=0.005, per_token=0.001, steps=40)
    baseline = budget.tokens(2)
    assert baseline == pytest.approx(35, abs=1)

    feed(budget.cost, overhead=0.005, per_token=0.003, steps=60, seed=3)  # a longer context
    slower = budget.tokens(2)
    assert slower == pytest.approx(11, abs=1)

    feed(budget.cost, overhead=0.005, per_token=0.0005, steps=60, seed=4)
    faster = budget.tokens(2)
    assert faster == pytest.approx(70, rel=0.05)
    assert slower < baseline < faster


def test_the_budget_observes_through_to_its_linear_fit():
    budget = TokenBudget(0.05, 512)
    for tokens in (1, 50, 1, 50, 1, 50):
        budget.observe(tokens, 0.002 + 0.0004 * tokens)
    assert budget.cost.per_token == pytest.approx(0.0004, rel=1e-6)


def test_a_step_that_ran_over_the_target_shrinks_the_next_one():
    budget = TokenBudget(0.1, 512, safety=1.0)
    budget.observe(20, 0.2)  # twice the target for 20 tokens
    # 0.0095 s a token beyond the 0.01 s overhead: 10.5 tokens fewer take 0.1 s less.
    assert budget.tokens(1) == 9


def test_a_size_follows_its_own_steps_within_a_few_of_them():
    budget = TokenBudget(0.1, 512, safety=1.0)
    budget.observe(20, 0.2)
    assert budget.tokens(1) == 9
    for _ in range(6):
        budget.observe(20, 0.1)  # the same size, now on target
    assert budget.times.predict(20) == pytest.approx(0.1, rel=0.05)
    assert budget.tokens(1) >= 19


def test_a_decode_only_step_is_a_measurement_of_its_own_size_only():
    budget = TokenBudget(0.1, 512, safety=1.0)
    for _ in range(4):
        budget.observe(40, 0.08)
    budget.observe(1, 0.5)  # one slow decode-only step (a stall, another process)
    assert budget.times.predict(40) == pytest.approx(0.08)
    assert budget.tokens(1) >= 40


def test_the_mixed_budget_never_drops_below_one_prompt_token_per_step():
    budget = TokenBudget(0.1, 512)
    budget.observe(6, 0.1)
    # 6 tokens took the whole 0.1 s: 4.7 fit the target with its safety margin, so only the
    # decodes' 4 would fit; one prompt token rides along all the same.
    assert budget.tokens(4) == 5


def test_a_mixed_step_far_over_the_target_starts_sharing_the_step():
    budget = TokenBudget(0.1, 512)
    budget.observe(5, 10.0)  # decodes alone overran the target a hundredfold
    assert budget.tokens(4) == 4 + 32


# --- steps sized by who reads them -------------------------------------------------------------


def test_a_step_whose_streams_are_all_background_takes_the_whole_batch():
    budget = TokenBudget(0.1, 512, cost=StepCostModel(overhead=0.005, per_token=0.001))
    assert budget.tokens(3, interactive=True) == 75  # (0.08 - 0.005) / 0.001
    assert budget.tokens(3, interactive=False) == 512  # 0.8 s would take 795: the batch is less


def test_background_streams_have_a_loose_target_of_their_own():
    # A slow machine: a full batch would take 2 s, more than a background stream may wait.
    cost = StepCostModel(overhead=0.005, per_token=0.004)
    budget = TokenBudget(0.1, 512, background_itl_target=0.5, cost=cost)
    assert budget.tokens(3, interactive=False) == 98  # (0.4 - 0.005) / 0.004
    assert budget.tokens(3, interactive=True) == 18
    assert budget.fits(98, interactive=False) and not budget.fits(98, interactive=True)


# --- the step-time curve -----------------------------------------------------------------------

# Step times by size shaped like the 2-core CPU's (SmolLM2-135M): per-token cost falls with size,
# and a 128-token step costs less than a 64-token one (llama.cpp's kernels change with the batch).
CPU_STEPS = {8: 0.030, 16: 0.036, 32: 0.048, 64: 0.090, 128: 0.070, 256: 0.125, 512: 0.240}


def measured(budget: TokenBudget, steps: dict[int, float], rounds: int = 3) -> TokenBudget:
    for _ in range(rounds):
        for tokens, seconds in steps.items():
            budget.observe(tokens, seconds)
    return budget


def test_the_curve_chooses_the_larger_chunk_when_it_is_cheaper():
    budget = measured(TokenBudget(0.1, 512), CPU_STEPS)
    chosen = budget.tokens(4)
    # 64 tokens overrun the 0.08 s the target allows, 128 do not: a line through the steps
    # cannot say so, the measured curve can.
    assert not budget.fits(64) and budget.fits(128)
    assert 128 < chosen < 256
    assert budget.fits(chosen)
    linear = budget.cost
    assert linear.predict(chosen) > 0.08  # the linear fit alone would not dare this size
    assert (0.08 - linear.overhead) / linear.per_token < chosen


def test_between_two_measured_sizes_the_curve_is_the_line_joining_them():
    budget = measured(TokenBudget(0.1, 512), CPU_STEPS)
    assert budget.times.predict(128) == pytest.approx(0.070)
    assert budget.times.predict(192) == pytest.approx((0.070 + 0.125) / 2)
    # 128 + 128 * (0.08 - 0.070) / (0.125 - 0.070): where the line crosses the target.
    assert budget.tokens(4) == 151


def test_beyond_the_measured_sizes_the_linear_fit_extends_the_curve():
    budget = measured(TokenBudget(1.0, 2048), {16: 0.036, 64: 0.060})
    slope = budget.cost.per_token
    assert budget.times.predict(164) == pytest.approx(0.060 + 100 * slope)
    assert budget.times.predict(6) == pytest.approx(0.036 - 10 * slope)


def test_a_size_not_measured_for_long_is_set_aside():
    budget = measured(TokenBudget(0.1, 512), {128: 0.070})
    assert budget.times.predict(128) == pytest.approx(0.070)
    for _ in range(budget.times.stale_after):
        budget.observe(8, 0.030)
    assert [round(n) for n, _ in budget.times.curve()] == [8]  # only what is current


def test_one_stalled_step_does_not_move_the_curve():
    budget = measured(TokenBudget(0.1, 512), {32: 0.05, 64: 0.09}, rounds=4)
    assert budget.tokens(4) == 56  # 32 + 32 * (0.08 - 0.05) / (0.09 - 0.05)
    budget.observe(64, 1.0)  # another process took the CPU for a second
    assert budget.times.predict(64) == pytest.approx(0.09)
    assert budget.tokens(4) == 56


# --- the budget's own error, the work between steps, the knee (issue 32) -------------------------


def linear_budget(**kwargs) -> TokenBudget:
    return TokenBudget(0.1, 512, cost=StepCostModel(overhead=0.005, per_token=0.001), **kwargs)


def test_until_steps_are_measured_a_step_is_planned_at_the_prior_headroom():
    budget = linear_budget()
    assert budget.safety == 0.8
    assert budget.tokens(1) == 75  # (0.08 - 0.005) / 0.001


def test_steps_that_land_on_their_prediction_fill_the_whole_target():
    budget = linear_budget()
    for _ in range(20):
        budget.observe(50, 0.055, predicted=0.055)
    assert budget.safety == 1.0
    assert budget.times.predict(budget.tokens(1)) == pytest.approx(0.1, abs=0.002)


def test_steps_that_run_over_their_prediction_leave_headroom_for_nine_in_ten():
    budget = linear_budget()
    for n in range(40):  # one step in four runs 25 % over what was predicted
        budget.observe(50, 0.055 * (1.25 if n % 4 == 0 else 1.0), predicted=0.055)
    assert budget.safety == pytest.approx(0.8)
    # ...and never less than half the target, however wrong the predictions were
    for _ in range(64):
        budget.observe(50, 0.5, predicted=0.055)
    assert budget.safety == 0.5


def test_the_work_between_two_steps_comes_off_the_target():
    budget = linear_budget()
    for _ in range(20):
        budget.observe(50, 0.055, predicted=0.055)
    for _ in range(5):
        budget.observe_between(0.02)
    assert budget.between_steps == pytest.approx(0.02)
    assert budget.limit(True) == pytest.approx(0.08)
    assert budget.tokens(1) == 75  # (0.1 - 0.02 - 0.005) / 0.001


# Step times shaped like a CPU's: the cost per token falls until ~32 tokens, then barely.
KNEE_STEPS = {1: 0.010, 4: 0.020, 16: 0.050, 32: 0.080, 64: 0.150, 128: 0.290}


def test_a_step_nobody_reads_stops_at_the_knee_of_the_cost_curve():
    budget = measured(linear_budget(background_itl_target=1.0), KNEE_STEPS)
    # Per token: 2.5 ms at 32, 2.34 at 64, 2.27 at 128, ~2.2 where the fit reaches 1 s: 64 is
    # the smallest within 10 % of the cheapest, so a background step takes 0.15 s, not 1.
    assert budget.knee_seconds() == pytest.approx(0.150)
    assert budget.target(False) == pytest.approx(0.150)
    assert budget.tokens(3, interactive=True) < budget.tokens(3, interactive=False) < 64
    assert budget.background_tokens() < 64  # nobody decoding: not the whole batch either


def test_the_knee_never_sizes_a_background_step_below_a_persons_target():
    budget = measured(linear_budget(background_itl_target=1.0), {1: 0.010, 2: 0.020, 4: 0.040})
    assert budget.knee_seconds() < 0.1
    assert budget.target(False) == pytest.approx(0.1)


def test_where_larger_steps_stay_cheaper_a_background_step_grows_to_find_out():
    # A GPU's curve: 8 tokens cost what 1 does, so per token the largest measured is the
    # cheapest and the linear fit promises cheaper still beyond it: the knee moves out.
    budget = measured(linear_budget(background_itl_target=1.0),
                      {1: 0.010, 2: 0.010, 4: 0.010, 8: 0.011})  # fmt: skip
    assert budget.knee_seconds() > 0.011
    assert budget.tokens(3, interactive=False) > 8


def test_steps_that_verify_drafts_are_timed_on_a_curve_of_their_own():
    budget = measured(TokenBudget(0.1, 512), {8: 0.030, 16: 0.045})
    for _ in range(3):
        budget.observe(16, 0.090, verified=True)  # drafts: logits everywhere, several passes
    assert budget.times.predict(16) == pytest.approx(0.045)  # a prompt chunk is no dearer
    assert budget.predict_verified(16) == pytest.approx(0.090)
    assert budget.predict_verified(8) >= budget.times.predict(8)


def test_calibration_starts_both_curves_and_only_the_plain_one_lets_its_steps_replace_it():
    budget = TokenBudget(0.1, 512)
    budget.calibrate(16, 0.080)  # logits at every position: dearer than a prompt chunk
    for _ in range(5):
        budget.observe(16, 0.050)
    assert budget.times.predict(16) == pytest.approx(0.050)
    assert budget.predict_verified(16) == pytest.approx(0.080)
