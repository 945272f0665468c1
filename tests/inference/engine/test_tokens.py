"""Tokenize and detokenize through an engine (inference.engine.tokens): computed by the runner
on the engine thread, bounds checked at once, never beside a step."""

import threading

import pytest

from inference.engine import InvalidParams
from inference.engine.tokens import MAX_TEXT_CHARS, MAX_TOKENS, Tokens, check_ids
from tests.inference.engine.fakes import BYTE_BASE, EOG, FakeRunner, char_tokens


def test_tokenize_gives_the_runners_ids_and_pieces(make_engine):
    engine, _ = make_engine()
    tokens = engine.tokenize("héllo", with_pieces=True).result(timeout=5)
    assert tokens == Tokens(tuple(char_tokens("héllo")), tuple(c.encode() for c in "héllo"))
    assert engine.tokenize("hi").result(timeout=5).pieces is None


def test_detokenize_round_trips_and_joins_split_bytes(make_engine):
    engine, _ = make_engine()
    ids = list(engine.tokenize("naïve 🌍").result(timeout=5).ids)
    assert engine.detokenize(ids).result(timeout=5) == "naïve 🌍"
    split = [BYTE_BASE + b for b in "🌍".encode()]  # one character over four byte tokens
    assert engine.detokenize(split).result(timeout=5) == "🌍"
    assert engine.detokenize([EOG]).result(timeout=5) == ""


def test_the_runner_is_called_on_the_engine_thread(make_engine):
    seen = []

    class Watching(FakeRunner):
        def tokenize(self, text, add_special=True, parse_special=True):
            seen.append(threading.current_thread().name)
            return super().tokenize(text, add_special, parse_special)

    engine, _ = make_engine(Watching())
    engine.tokenize("hi").result(timeout=5)
    assert seen and seen[0] != threading.current_thread().name


@pytest.mark.parametrize("bad", [[-1], [BYTE_BASE + 256], [True], ["1"], [1.0]])
def test_ids_outside_the_vocabulary_are_refused_at_once(make_engine, bad):
    engine, _ = make_engine()
    with pytest.raises(InvalidParams) as refused:
        engine.detokenize([65, *bad])
    assert refused.value.field == "tokens" and "tokens[1]" in refused.value.message


def test_too_long_a_text_or_too_many_ids_are_refused_at_once(make_engine):
    engine, _ = make_engine()
    with pytest.raises(InvalidParams) as refused:
        engine.tokenize("a" * (MAX_TEXT_CHARS + 1))
    assert refused.value.field == "content"
    with pytest.raises(InvalidParams):
        check_ids([1] * (MAX_TOKENS + 1), n_vocab=10)
