"""The model-free parts of embeddings: packing inputs into decodes, checking them, and shaping
the vectors (inference.engine.embedding)."""

import array
import base64
import math
import struct

import pytest

from inference.engine import InvalidParams, PromptTooLong
from inference.engine.embedding import MAX_TOTAL_TOKENS, Embedding, pack, prepare


def chars(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_packing_keeps_the_order_and_respects_both_limits():
    sequences = [[1] * 3, [1] * 4, [1] * 2, [1] * 5, [1]]
    assert pack(sequences, max_tokens=7, max_seqs=2) == [[0, 1], [2, 3], [4]]
    assert pack(sequences, max_tokens=100, max_seqs=1) == [[0], [1], [2], [3], [4]]
    assert pack(sequences, max_tokens=100, max_seqs=8) == [[0, 1, 2, 3, 4]]


def test_packing_refuses_a_sequence_longer_than_a_decode():
    with pytest.raises(ValueError):
        pack([[1] * 9], max_tokens=8, max_seqs=4)


def test_prepare_tokenizes_texts_and_takes_token_arrays_as_they_are():
    assert prepare(["ab", [5, 6, 7]], chars, n_vocab=1000, limit=10, truncate=True) == [
        [97, 98], [5, 6, 7]
    ]  # fmt: skip


def test_prepare_cuts_or_refuses_an_input_over_the_limit():
    assert prepare(["abcdef"], chars, n_vocab=1000, limit=4, truncate=True) == [[97, 98, 99, 100]]
    with pytest.raises(PromptTooLong, match="6 tokens"):
        prepare(["abcdef"], chars, n_vocab=1000, limit=4, truncate=False)


@pytest.mark.parametrize("bad", [[1000], [-1], [True], [1.0]])
def test_prepare_refuses_token_ids_that_are_not_in_the_vocabulary(bad):
    with pytest.raises(InvalidParams) as refused:
        prepare(["ok", bad], chars, n_vocab=1000, limit=10, truncate=True)
    assert refused.value.field == "input"
    assert "input 1" in str(refused.value)


def test_prepare_refuses_empty_inputs_and_too_many_tokens_together():
    with pytest.raises(InvalidParams, match="empty"):
        prepare([""], chars, n_vocab=1000, limit=10, truncate=True)
    many = [[1] * 1000] * (MAX_TOTAL_TOKENS // 1000 + 1)
    with pytest.raises(InvalidParams, match="together"):
        prepare(many, chars, n_vocab=1000, limit=1000, truncate=True)


def test_vectors_come_back_raw_normalised_and_as_little_endian_base64():
    data = array.array("f", [3.0, 4.0, 0.0, 0.0, 0.0, 0.0]).tobytes()
    result = Embedding(dim=3, data=data, token_counts=(2, 1))
    assert result.vectors(normalised=False) == [[3.0, 4.0, 0.0], [0.0, 0.0, 0.0]]
    unit, zero = result.vectors(normalised=True)
    assert unit == pytest.approx([0.6, 0.8, 0.0])
    assert zero == [0.0, 0.0, 0.0]  # a zero vector stays zero, as in Ollama
    decoded = struct.unpack("<3f", base64.b64decode(result.base64(0, normalised=True)))
    assert decoded == pytest.approx([0.6, 0.8, 0.0])
    assert math.isclose(math.fsum(x * x for x in decoded), 1.0, rel_tol=1e-6)
    assert result.prompt_tokens == 3
