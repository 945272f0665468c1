"""Tokens from a runner process on real llama.cpp with the starter model, through the host as the
API asks for them: the ids a generation's prompt gets, pieces that join to the text, a round
trip back to the text, and ids outside the vocabulary refused in the runner."""

import pytest

from inference.engine import GenerationRequest, RefusalKind, Refused
from inference.engine.host import EngineHost, ModelSpec
from inference.engine.params import SamplingParams
from inference.engine.runner_config import RunnerConfig
from inference.engine.tokens import Tokens
from inference.serving.supervisor import RunnerSupervisor

pytestmark = pytest.mark.model

TEXT = "Why is the sky blue? Ünïcödé, emoji 🌍 and <|im_start|> a special token."


@pytest.fixture
def spec(starter_path, extra_bufts) -> ModelSpec:
    config = RunnerConfig(str(starter_path), ctx_per_seq=512, parallel=2, cache_slots=0,
                          n_threads=2, use_extra_bufts=extra_bufts)  # fmt: skip
    return ModelSpec("smol", config, -1)


@pytest.fixture
def host(tmp_path):
    host = EngineHost(engine_factory=RunnerSupervisor(state_dir=tmp_path).start)
    yield host
    host.shutdown()


def test_the_ids_are_those_a_generation_of_the_same_text_counts(host, spec):
    future, waited = host.tokenize(spec, TEXT, add_special=True)
    tokens = future.result(timeout=300)
    assert isinstance(tokens, Tokens) and tokens.pieces is None
    assert waited > 0  # this call loaded the model
    asked = GenerationRequest(prompt=TEXT, params=SamplingParams(max_tokens=1), model="smol")
    handle = host.submit(spec, asked)
    done = [e for e in handle.events(timeout=300) if e.type == "done"][0]
    assert done.figures["prompt_tokens"] == len(tokens.ids)
    # The special token is parsed as one id, as in a prompt.
    parsed, _ = host.tokenize(spec, "<|im_start|>", add_special=False)
    assert len(parsed.result(timeout=60).ids) == 1


def test_without_parse_special_a_special_tokens_text_is_plain_characters(host, spec):
    # As llama-server reads /infill's code: the text, not the control token.
    future, _ = host.tokenize(spec, "<|im_start|>", add_special=False, parse_special=False,
                              with_pieces=True)  # fmt: skip
    plain = future.result(timeout=300)
    assert len(plain.ids) > 1 and b"".join(plain.pieces) == b"<|im_start|>"


def test_pieces_join_to_the_text_and_detokenize_round_trips(host, spec):
    future, _ = host.tokenize(spec, TEXT, add_special=False, with_pieces=True)
    tokens = future.result(timeout=300)
    assert len(tokens.pieces) == len(tokens.ids)
    assert b"".join(tokens.pieces).decode("utf-8") == TEXT
    text, _ = host.detokenize(spec, list(tokens.ids))
    assert text.result(timeout=60) == TEXT


def test_ids_outside_the_vocabulary_are_refused_naming_the_field(host, spec):
    future, _ = host.detokenize(spec, [1, 10_000_000])
    with pytest.raises(Refused) as refused:
        future.result(timeout=300)
    assert (refused.value.kind, refused.value.field) == (RefusalKind.INVALID, "tokens")
    assert "vocabulary (0 to" in refused.value.message
