"""Embeddings on real llama.cpp with the real small model (SmolLM2-135M-Instruct): one runner
per module, through the engine, as a runner process computes them."""

import math
import threading

import pytest

from inference.engine import Engine, InvalidParams, PromptTooLong, SamplingParams
from inference.engine.embedding import MAX_INPUTS
from inference.gguf.reader import read_gguf
from tests.inference.engine.fakes import ask

pytestmark = pytest.mark.model

TEXTS = [
    "The sky is blue because of Rayleigh scattering.",
    "hello",
    "Turn on the kitchen lights at sunset, every day of the week. " * 8,
    "Kubernetes schedules containers onto nodes.",
]


@pytest.fixture(scope="module")
def engine(starter_path, extra_bufts):
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig

    runner = LlamaRunner(
        RunnerConfig(model_path=str(starter_path), ctx_per_seq=512, parallel=2, cache_slots=0,
                     n_threads=2, use_extra_bufts=extra_bufts)
    )  # fmt: skip
    engine = Engine(runner, itl_target=0.1).start()
    yield engine
    engine.shutdown()


def embed(engine, inputs, **kwargs):
    return engine.embed(inputs, **kwargs).result(timeout=300)


def length(vector) -> float:
    return math.sqrt(math.fsum(x * x for x in vector))


def largest_difference(a, b) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_each_input_gets_one_vector_of_the_models_embedding_size(engine, starter_path):
    result = embed(engine, TEXTS)
    n_embd = read_gguf(str(starter_path)).embedding_length
    assert n_embd == 576
    assert result.dim == n_embd
    vectors = result.vectors(normalised=False)
    assert [len(v) for v in vectors] == [n_embd] * len(TEXTS)
    assert result.token_counts == tuple(len(engine.runner.tokenize(t)) for t in TEXTS)
    assert result.prompt_tokens == sum(result.token_counts)


def test_normalised_vectors_have_length_one_and_the_raw_ones_do_not(engine):
    result = embed(engine, TEXTS[:2])
    for raw, unit in zip(result.vectors(False), result.vectors(True), strict=True):
        assert abs(length(unit) - 1.0) < 1e-5
        assert length(raw) > 1.5  # mean-pooled hidden states of this model are far from unit
        scale = length(raw)
        assert largest_difference([x / scale for x in raw], unit) < 1e-6


def test_the_raw_vector_is_llama_cpp_pythons_own_mean_pooled_embedding(
    engine, starter_path, extra_bufts, monkeypatch
):
    import llama_cpp
    import llama_cpp.llama_cpp as low_level
    from llama_cpp import Llama

    defaults = low_level.llama_model_default_params

    def host_defaults():  # the CPU self-check's verdict, as in test_llama_runner
        params = defaults()
        params.use_extra_bufts = extra_bufts
        return params

    monkeypatch.setattr(low_level, "llama_model_default_params", host_defaults)
    reference = Llama(str(starter_path), embedding=True, n_ctx=512, n_batch=512, n_ubatch=512,
                      pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_threads=2,
                      flash_attn=True, verbose=False)  # fmt: skip
    try:
        expected = reference.embed(TEXTS[0], normalize=False)
    finally:
        reference.close()
    ours = embed(engine, [TEXTS[0]]).vectors(normalised=False)[0]
    assert largest_difference(ours, expected) < 1e-4


def test_the_same_text_gives_the_same_vector_alone_or_batched_in_any_order(engine):
    batched = embed(engine, TEXTS).vectors(False)
    backwards = embed(engine, TEXTS[::-1]).vectors(False)[::-1]
    for text, together, reversed_ in zip(TEXTS, batched, backwards, strict=True):
        alone = embed(engine, [text]).vectors(False)[0]
        assert largest_difference(alone, together) < 1e-5
        assert largest_difference(alone, reversed_) < 1e-5


def test_different_texts_give_different_vectors(engine):
    sky, hello = embed(engine, TEXTS[:2]).vectors(True)
    cosine = math.fsum(a * b for a, b in zip(sky, hello, strict=True))
    assert cosine < 0.99


def test_a_token_array_embeds_like_the_text_it_tokenizes_to(engine):
    ids = engine.runner.tokenize(TEXTS[3])
    from_text, from_ids = embed(engine, [TEXTS[3], ids]).vectors(False)
    assert largest_difference(from_text, from_ids) < 1e-5


def test_a_token_id_outside_the_vocabulary_is_refused_naming_the_input(engine):
    n_vocab = engine.runner.n_vocab
    with pytest.raises(InvalidParams) as refused:
        engine.embed(["fine", [1, n_vocab]])
    assert refused.value.field == "input"
    assert f"token id {n_vocab}" in str(refused.value) and "input 1" in str(refused.value)
    with pytest.raises(InvalidParams):
        engine.embed([[-1]])


def test_an_over_long_input_is_cut_to_the_limit_with_truncate_and_refused_without(engine):
    limit = engine.runner.embed_limit
    long_text = "word " * (limit + 100)
    with pytest.raises(PromptTooLong) as refused:
        engine.embed([long_text], truncate=False)
    assert f"hold {limit} tokens" in str(refused.value)
    cut = embed(engine, [long_text], truncate=True)
    assert cut.token_counts == (limit,)
    prefix = engine.runner.tokenize(long_text)[:limit]
    whole_prefix = embed(engine, [prefix]).vectors(False)[0]
    assert largest_difference(cut.vectors(False)[0], whole_prefix) < 1e-5


def test_no_inputs_or_too_many_are_refused(engine):
    with pytest.raises(InvalidParams):
        engine.embed([])
    with pytest.raises(InvalidParams):
        engine.embed(["x"] * (MAX_INPUTS + 1))


def test_embedding_beside_a_generation_leaves_the_generation_unchanged(engine):
    prompt = "<|im_start|>user\nName three colours.<|im_end|>\n<|im_start|>assistant\n"
    params = SamplingParams(temperature=0.0, max_tokens=24)

    def answer() -> str:
        final = list(engine.submit(ask(prompt, params)).events(timeout=120))[-1]
        assert final.type == "done"
        return final.text

    alone = answer()
    vectors: list = []
    worker = threading.Thread(target=lambda: vectors.append(embed(engine, TEXTS * 4)))
    worker.start()
    beside = answer()
    worker.join(300)
    assert beside == alone
    assert vectors and vectors[0].count == len(TEXTS) * 4
    assert not engine.busy
