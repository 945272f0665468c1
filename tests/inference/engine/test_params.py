import math

import pytest

from inference.engine.params import (
    MAX_STOP_LENGTH,
    MAX_STOP_STRINGS,
    MAX_TOP_LOGPROBS,
    SEED_LIMIT,
    InvalidParams,
    SamplingParams,
)

OUT_OF_RANGE = [
    ("temperature", -0.1), ("temperature", 5.01),
    ("top_p", -0.01), ("top_p", 1.01),
    ("min_p", -0.01), ("min_p", 1.5),
    ("repeat_penalty", -1.0), ("repeat_penalty", 5.5),
    ("presence_penalty", -2.1), ("presence_penalty", 2.1),
    ("frequency_penalty", -2.1), ("frequency_penalty", 2.1),
    ("top_k", -1), ("top_k", 100_001),
    ("repeat_last_n", -2), ("repeat_last_n", (1 << 16) + 1),
    ("max_tokens", 0), ("max_tokens", -5), ("max_tokens", (1 << 20) + 1),
    ("seed", -1), ("seed", SEED_LIMIT + 1),
    ("logprobs", -1), ("logprobs", MAX_TOP_LOGPROBS + 1),
]  # fmt: skip
FLOAT_FIELDS = [
    "temperature", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty",
]  # fmt: skip
INT_FIELDS = ["top_k", "repeat_last_n", "max_tokens", "seed", "logprobs"]
OPTIONAL = {"seed", "logprobs"}  # None: not set (a fresh random seed; no logprobs)


def test_the_defaults_are_valid():
    params = SamplingParams()
    assert params.stop == ()
    assert not params.greedy
    assert not params.uses_penalties


@pytest.mark.parametrize(("name", "value"), OUT_OF_RANGE)
def test_an_out_of_range_number_is_rejected_naming_the_field(name, value):
    with pytest.raises(InvalidParams) as caught:
        SamplingParams(**{name: value})
    assert caught.value.field == name
    assert str(caught.value).startswith(f"{name}:")


WRONG_TYPES = [
    (name, value)
    for name in FLOAT_FIELDS + INT_FIELDS
    for value in (True, False, "1", None, [1])
    if not (name in OPTIONAL and value is None)
]


@pytest.mark.parametrize(("name", "value"), WRONG_TYPES)
def test_a_number_of_the_wrong_type_is_rejected_naming_the_field(name, value):
    with pytest.raises(InvalidParams) as caught:
        SamplingParams(**{name: value})
    assert caught.value.field == name


@pytest.mark.parametrize("name", FLOAT_FIELDS)
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_float_that_is_not_finite_is_rejected(name, value):
    with pytest.raises(InvalidParams) as caught:
        SamplingParams(**{name: value})
    assert caught.value.field == name


@pytest.mark.parametrize("name", INT_FIELDS)
@pytest.mark.parametrize("value", [1.0, 2.5, math.nan, math.inf])
def test_an_integer_field_given_a_float_is_rejected(name, value):
    with pytest.raises(InvalidParams) as caught:
        SamplingParams(**{name: value})
    assert caught.value.field == name


def test_the_bounds_themselves_are_accepted():
    params = SamplingParams(
        temperature=0.0, top_p=1.0, min_p=0.0, top_k=0, repeat_last_n=-1, max_tokens=1,
        seed=SEED_LIMIT, presence_penalty=-2.0, frequency_penalty=2.0, repeat_penalty=5.0,
        logprobs=MAX_TOP_LOGPROBS,
    )  # fmt: skip
    assert SamplingParams(logprobs=0).logprobs == 0  # the sampled token's alone
    assert params.greedy
    assert params.uses_penalties


def test_an_integer_is_accepted_for_a_float_field():
    assert SamplingParams(temperature=1).temperature == 1


def test_a_single_stop_string_becomes_a_tuple():
    assert SamplingParams(stop="\n\n").stop == ("\n\n",)


def test_a_list_of_stop_strings_becomes_a_tuple():
    assert SamplingParams(stop=["a", "b"]).stop == ("a", "b")


def test_too_many_stop_strings_are_rejected():
    with pytest.raises(InvalidParams) as caught:
        SamplingParams(stop=[str(i) for i in range(MAX_STOP_STRINGS + 1)])
    assert caught.value.field == "stop"


@pytest.mark.parametrize("bad", ["x" * (MAX_STOP_LENGTH + 1), "", 5, None])
def test_a_stop_string_too_long_empty_or_not_a_string_is_rejected(bad):
    with pytest.raises(InvalidParams) as caught:
        SamplingParams(stop=["ok", bad])
    assert caught.value.field == "stop"


def test_stop_of_another_type_is_rejected():
    with pytest.raises(InvalidParams) as caught:
        SamplingParams(stop=5)
    assert caught.value.field == "stop"


def test_params_are_immutable():
    params = SamplingParams()
    with pytest.raises(AttributeError):
        params.temperature = 3.0
