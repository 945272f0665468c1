"""Logit bias, ignore_eos and locally typical sampling on real llama.cpp with the starter model:
a ban moves greedy decoding off the token it would pick, a +100 bias makes a token the pick, and
ignore_eos runs an answer past the end it would have stopped at."""

import json

import pytest

from inference.engine import SamplingParams
from inference.engine.generation import GenerationRequest
from inference.engine.params import MAX_LOGIT_BIAS, InvalidParams
from tests.inference.engine.fakes import ask
from tests.inference.engine.test_llama_runner import (  # noqa: F401 - the fixtures
    CHAT,
    engine,
    generate_ids,
    model_path,
)

pytestmark = pytest.mark.model

PROMPT = CHAT.format(question="What is the capital of France?")


def greedy(**fields) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=fields.pop("max_tokens", 8), **fields)


def test_a_ban_moves_greedy_decoding_off_its_first_token(engine):  # noqa: F811
    _, ids = generate_ids(engine, PROMPT, greedy())
    _, banned = generate_ids(engine, PROMPT, greedy(logit_bias=((ids[0], -100.0),)))
    assert banned[0] != ids[0]
    assert ids[0] not in banned


def test_a_bias_of_100_makes_a_token_the_pick_at_every_step(engine):  # noqa: F811
    token = engine.runner.tokenize(" banana", add_special=False)[0]
    _, ids = generate_ids(engine, PROMPT, greedy(max_tokens=4, logit_bias=((token, 100.0),)))
    assert ids == [token] * 4


def test_ignore_eos_runs_the_answer_to_max_tokens(engine):  # noqa: F811
    final, ids = generate_ids(engine, PROMPT, greedy(max_tokens=64))
    assert final.finish_reason == "stop" and len(ids) < 64  # the model ends this answer itself
    final, more = generate_ids(engine, PROMPT, greedy(max_tokens=64, ignore_eos=True))
    assert final.finish_reason == "length" and len(more) == 64
    assert more[: len(ids)] == ids
    assert not any(engine.runner.is_eog(token) for token in more)


def test_typical_sampling_with_a_seed_repeats(engine):  # noqa: F811
    params = SamplingParams(temperature=1.0, typical_p=0.5, seed=7, max_tokens=8)
    assert generate_ids(engine, PROMPT, params)[1] == generate_ids(engine, PROMPT, params)[1]


def test_a_token_id_past_the_vocabulary_is_refused_at_submit(engine):  # noqa: F811
    with pytest.raises(InvalidParams) as error:
        engine.submit(ask(PROMPT, greedy(logit_bias=((engine.runner.n_vocab, 1.0),))))
    assert error.value.field == "logit_bias"


@pytest.mark.parametrize("pairs", [
    ((1, 101.0),), ((1, float("nan")),), ((-1, 1.0),), ((1 << 31, 1.0),), ((True, 1.0),),
    ((1, "x"),), ((1,),), tuple((t, 1.0) for t in range(MAX_LOGIT_BIAS + 1)),
])  # fmt: skip
def test_a_malformed_logit_bias_is_refused_naming_it(pairs):
    with pytest.raises(InvalidParams) as error:
        SamplingParams(logit_bias=pairs)
    assert error.value.field == "logit_bias"


def test_logit_bias_pairs_survive_the_json_wire():
    request = GenerationRequest("x", SamplingParams(logit_bias=((5, -100), (9, 2.5)),
                                                    ignore_eos=True))  # fmt: skip
    again = GenerationRequest.from_wire(json.loads(json.dumps(request.to_wire())))
    assert again.params == request.params
    assert again.params.logit_bias == ((5, -100.0), (9, 2.5))
