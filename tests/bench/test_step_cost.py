"""bench/step_cost.py's arithmetic: a prompt token's cost in a mixed step, against read whole."""

import pytest

from bench.raw import ids_in_runs
from bench.step_cost import fitting_chunk, ratios

# A decode-only step of 40 ms; each prompt token beside it 4 ms; read whole, 3.2 ms a token.
STEPS = {0: 40.0, 8: 72.0, 16: 104.0, 32: 168.0}


def test_a_prompt_tokens_cost_is_what_the_chunk_adds_to_the_decode_only_step_per_token():
    assert ratios(STEPS, 3.2) == pytest.approx({8: 1.25, 16: 1.25, 32: 1.25})


def test_the_decode_only_step_itself_has_no_ratio():
    assert 0 not in ratios(STEPS, 3.2)


def test_the_chunk_inside_the_target_is_the_largest_measured_whose_step_fits():
    assert fitting_chunk(STEPS, 130.0) == 16
    assert fitting_chunk(STEPS, 168.0) == 32


def test_no_chunk_fits_a_target_the_decode_only_step_already_fills():
    assert fitting_chunk(STEPS, 50.0) == 0


def test_decoders_in_one_run_take_consecutive_ids():
    assert ids_in_runs(8, 1) == [0, 1, 2, 3, 4, 5, 6, 7]


def test_runs_are_as_equal_as_they_can_be_with_one_idle_id_between_two():
    assert ids_in_runs(8, 2) == [0, 1, 2, 3, 5, 6, 7, 8]
    assert ids_in_runs(8, 3) == [0, 1, 2, 4, 5, 6, 8, 9]


def test_more_runs_than_sequences_is_refused():
    with pytest.raises(ValueError):
        ids_in_runs(2, 3)
