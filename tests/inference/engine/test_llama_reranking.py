"""Reranking on real llama.cpp: the starter model with pooling type rank in its header
(tests.rerankers), through the engine as a runner process runs it, held to llama.cpp's own
scores computed in another process."""

import pytest

from inference.engine import Engine, InvalidParams, PromptTooLong, SamplingParams
from inference.engine.embedding import TURN_INPUTS
from inference.engine.reranking import MAX_DOCUMENTS, PairLayout, pair_tokens, scores
from tests.inference.engine.fakes import ask
from tests.rerankers import reference_scores

pytestmark = pytest.mark.model

QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital of France.", "hello", "The capital of France is Paris.",
             "Kubernetes schedules containers onto nodes."]  # fmt: skip


def start(path, extra_bufts) -> Engine:
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig

    runner = LlamaRunner(
        RunnerConfig(model_path=str(path), ctx_per_seq=512, parallel=1, cache_slots=0,
                     n_threads=2, use_extra_bufts=extra_bufts)
    )  # fmt: skip
    return Engine(runner, itl_target=0.1).start()


@pytest.fixture(scope="module")
def engine(reranker_path, extra_bufts):
    engine = start(reranker_path, extra_bufts)
    yield engine
    engine.shutdown()


def rank(engine, documents, query=QUERY, **kwargs):
    return engine.embed(documents, query=query, **kwargs).result(timeout=300)


def test_each_document_gets_llama_cpps_own_rank_score(engine, reranker_path):
    ranking = rank(engine, DOCUMENTS)
    expected = reference_scores(reranker_path, QUERY, DOCUMENTS)
    assert ranking.dim == 1
    assert list(ranking.token_counts) == [e["tokens"] for e in expected]
    for ours, theirs in zip(scores(ranking), expected, strict=True):
        assert abs(ours - theirs["score"]) < 1e-4
    assert len(set(scores(ranking))) == len(DOCUMENTS)  # the documents are told apart


def test_a_document_scores_the_same_alone_or_with_others(engine):
    together = scores(rank(engine, DOCUMENTS))
    for document, score in zip(DOCUMENTS, together, strict=True):
        assert abs(scores(rank(engine, [document]))[0] - score) < 1e-5


def test_the_pair_is_llama_servers_layout_without_a_rerank_template(engine):
    layout = engine.runner.pair_layout
    assert layout.template is None
    tokenize = engine.runner.tokenize
    expected = tokenize(QUERY, False, False) + tokenize(DOCUMENTS[0], False, False)
    assert not (layout.add_bos or layout.add_eos or layout.add_sep)  # SmolLM2 adds none
    assert pair_tokens(layout, QUERY, DOCUMENTS[0], tokenize) == expected


def test_a_full_layout_puts_bos_eos_and_sep_where_the_vocabulary_says():
    layout = PairLayout(None, bos=1, eos=2, sep=3, add_bos=True, add_eos=True, add_sep=True)

    def tokenize(text, add_special, parse_special):
        assert not add_special and not parse_special
        return [ord(c) for c in text]

    assert pair_tokens(layout, "q", "d", tokenize) == [1, ord("q"), 2, 3, ord("d"), 2]
    no_eos = PairLayout(None, eos=-1, sep=3, add_eos=True)
    assert pair_tokens(no_eos, "q", "d", tokenize) == [ord("q"), 3, ord("d"), 3]


def test_the_ggufs_rerank_template_is_used_where_it_has_one(templated_reranker_path, extra_bufts):
    engine = start(templated_reranker_path, extra_bufts)
    try:
        layout = engine.runner.pair_layout
        assert layout.template is not None and "{document}" in layout.template
        ids = pair_tokens(layout, QUERY, DOCUMENTS[0], engine.runner.tokenize)
        assert ids[0] == engine.runner.tokenize("<|im_start|>", False, True)[0]  # parsed
        ranking = rank(engine, DOCUMENTS)
        expected = reference_scores(templated_reranker_path, QUERY, DOCUMENTS)
        assert list(ranking.token_counts) == [e["tokens"] for e in expected]
        for ours, theirs in zip(scores(ranking), expected, strict=True):
            assert abs(ours - theirs["score"]) < 1e-4
    finally:
        engine.shutdown()


def test_an_over_long_pair_is_refused_or_cut_from_the_side_asked(engine):
    limit = engine.runner.embed_limit
    long_document = "word " * (limit + 50)
    with pytest.raises(PromptTooLong) as refused:
        engine.embed([DOCUMENTS[0], long_document], query=QUERY, truncate=False)
    assert "document 1" in str(refused.value) and f"holds {limit} tokens" in str(refused.value)
    assert rank(engine, [long_document], truncate=True).token_counts == (limit,)
    assert rank(engine, [long_document], truncate=True, truncate_left=True).token_counts == (limit,)


def test_no_documents_or_too_many_are_refused(engine):
    with pytest.raises(InvalidParams) as refused:
        engine.embed([], query=QUERY)
    assert refused.value.field == "documents"
    with pytest.raises(InvalidParams):
        engine.embed(["x"] * (MAX_DOCUMENTS + 1), query=QUERY)


def test_a_reranker_refuses_embeddings_and_generation_saying_what_it_is(engine):
    with pytest.raises(InvalidParams) as refused:
        engine.embed(["hello"])
    assert "is a reranker" in str(refused.value)
    with pytest.raises(InvalidParams) as refused:
        engine.submit(ask("hello", SamplingParams(max_tokens=4)))
    assert "is a reranker" in str(refused.value) and refused.value.field == "model"


def test_a_generative_model_refuses_to_rank(starter_path, extra_bufts):
    engine = start(starter_path, extra_bufts)
    try:
        with pytest.raises(InvalidParams) as refused:
            engine.embed(DOCUMENTS, query=QUERY)
        assert "not a reranker" in str(refused.value)
    finally:
        engine.shutdown()


def test_a_short_ranking_is_not_held_behind_a_long_one(engine):
    finished: list[str] = []
    long = engine.embed([f"document {i}" for i in range(3 * TURN_INPUTS)], query=QUERY)
    short = engine.embed(DOCUMENTS[:2], query=QUERY)
    long.add_done_callback(lambda _: finished.append("long"))
    short.add_done_callback(lambda _: finished.append("short"))
    assert len(scores(long.result(timeout=600))) == 3 * TURN_INPUTS
    assert len(scores(short.result(timeout=600))) == 2
    assert finished == ["short", "long"]
