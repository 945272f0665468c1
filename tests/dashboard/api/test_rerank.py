"""Reranking over plain HTTP on the served appliance (`manage.py serve`): a reranker (the starter
model with pooling type rank, tests.rerankers) and a chat model imported with `import_model`.
Cohere's and TEI's shapes, the order and scores llama.cpp gives (computed in another process),
top_n, the documents sent back, the 400s, and keys."""

import httpx
import pytest

from tests.live import LiveAppliance
from tests.rerankers import reference_scores

pytestmark = pytest.mark.model

RERANKER = "smollm2-reranker"
CHAT = "smollm2-chat"
QUERY = "What is the capital of France?"
DOCUMENTS = ["hello", "Paris is the capital of France.", "Kubernetes schedules containers.",
             "The capital of France is Paris."]  # fmt: skip
SETUP = f"""
from inference.models import LLMModel
LLMModel.objects.filter(name__in=[{RERANKER!r}, {CHAT!r}]).update(
    n_ctx=1024, parallel=1, n_threads=2, keep_alive="-1")
"""


@pytest.fixture(scope="module")
def served(tmp_path_factory, starter_path, reranker_path):
    appliance = LiveAppliance(tmp_path_factory.mktemp("rerank-live"),
                              API_RATE_LIMIT_PER_MINUTE="10000", LOG_LEVEL="WARNING")  # fmt: skip
    appliance.manage("migrate", "--no-input", "-v", "0")
    appliance.manage("import_model", str(reranker_path), "--name", RERANKER)
    appliance.manage("import_model", str(starter_path), "--name", CHAT)
    appliance.shell(SETUP)
    key = appliance.manage("create_api_key", "search").strip()
    appliance.start()
    try:
        yield appliance, key
    finally:
        appliance.stop()


@pytest.fixture(scope="module")
def http(served):
    appliance, key = served
    headers = {"Authorization": f"Bearer {key}"}
    with httpx.Client(base_url=appliance.url, headers=headers, timeout=300) as client:
        yield client


@pytest.fixture(scope="module")
def expected(reranker_path) -> list[dict]:
    return reference_scores(reranker_path, QUERY, DOCUMENTS)


def post(http, path: str, body: dict, status: int = 200):
    answer = http.post(path, json=body)
    assert answer.status_code == status, answer.text
    return answer.json()


def best_first(expected: list[dict]) -> list[int]:
    return sorted(range(len(expected)), key=lambda i: -expected[i]["score"])


def test_v1_rerank_gives_llama_cpps_scores_best_first(http, expected):
    answer = post(http, "/v1/rerank", {"model": RERANKER, "query": QUERY, "documents": DOCUMENTS})
    assert answer["model"] == RERANKER and answer["object"] == "list"
    tokens = sum(e["tokens"] for e in expected)
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    results = answer["results"]
    assert [r["index"] for r in results] == best_first(expected)
    for result in results:
        assert set(result) == {"index", "relevance_score"}
        assert abs(result["relevance_score"] - expected[result["index"]]["score"]) < 1e-4


def test_every_path_of_llama_server_answers_alike(http):
    body = {"model": RERANKER, "query": QUERY, "documents": DOCUMENTS}
    answers = [post(http, path, body)["results"]
               for path in ("/v1/rerank", "/rerank", "/v1/reranking", "/reranking")]  # fmt: skip
    assert all(answer == answers[0] for answer in answers)


def test_top_n_keeps_the_best_and_return_documents_sends_them_back(http, expected):
    documents = [DOCUMENTS[0], {"text": DOCUMENTS[1]}, *DOCUMENTS[2:]]  # Cohere's objects too
    answer = post(http, "/v1/rerank", {"model": RERANKER, "query": QUERY, "documents": documents,
                                       "top_n": 2, "return_documents": True})  # fmt: skip
    order = best_first(expected)[:2]
    assert [r["index"] for r in answer["results"]] == order
    assert [r["document"] for r in answer["results"]] == [{"text": DOCUMENTS[i]} for i in order]
    many = post(http, "/v1/rerank", {"model": RERANKER, "query": QUERY, "documents": DOCUMENTS,
                                     "top_n": 50})  # fmt: skip
    assert len(many["results"]) == len(DOCUMENTS)


def test_the_tei_body_gets_teis_bare_array(http, expected):
    answer = post(http, "/rerank", {"model": RERANKER, "query": QUERY, "texts": DOCUMENTS,
                                    "return_text": True, "raw_scores": False})  # fmt: skip
    assert isinstance(answer, list)
    assert [r["index"] for r in answer] == best_first(expected)
    for result in answer:
        assert set(result) == {"index", "score", "text"}
        assert result["text"] == DOCUMENTS[result["index"]]
        assert abs(result["score"] - expected[result["index"]]["score"]) < 1e-4
    plain = post(http, "/rerank", {"model": RERANKER, "query": QUERY, "texts": DOCUMENTS[:2]})
    assert all(set(r) == {"index", "score"} for r in plain)


@pytest.mark.parametrize("body, says", [
    ({"query": QUERY, "documents": []}, "non-empty"),
    ({"query": QUERY, "texts": []}, "non-empty"),
    ({"query": QUERY}, "non-empty"),
    ({"documents": DOCUMENTS}, "query"),
    ({"query": QUERY, "documents": DOCUMENTS, "texts": DOCUMENTS}, "not both"),
    ({"query": QUERY, "documents": DOCUMENTS, "top_n": 0}, "top_n"),
    ({"query": QUERY, "documents": ["x"] * 1001}, "documents"),
    ({"query": QUERY, "documents": [{"title": "x"}]}, "text"),
    ({"query": QUERY, "documents": [3]}, "documents"),
    ({"query": QUERY, "documents": ["x" * 300_000]}, "documents"),
])  # fmt: skip
def test_bad_bodies_are_400s_that_say_why(http, body, says):
    answer = post(http, "/v1/rerank", {"model": RERANKER, **body}, status=400)
    assert says in answer["error"]["message"]


def test_an_over_long_pair_is_a_400_unless_tei_asks_to_truncate(http):
    long_text = "word " * 1500
    refused = post(http, "/v1/rerank", {"model": RERANKER, "query": QUERY,
                                        "documents": ["hi", long_text]}, status=400)  # fmt: skip
    assert "document 1" in refused["error"]["message"]
    cut = post(http, "/rerank", {"model": RERANKER, "query": QUERY, "texts": [long_text],
                                 "truncate": True})  # fmt: skip
    assert len(cut) == 1


def test_a_chat_model_asked_to_rerank_says_it_is_not_a_reranker(http):
    answer = post(http, "/v1/rerank", {"model": CHAT, "query": QUERY, "documents": DOCUMENTS},
                  status=400)  # fmt: skip
    assert f'"{CHAT}" is not a reranker' in answer["error"]["message"]


def test_a_reranker_asked_to_chat_or_embed_says_what_it_is(http):
    chat = post(http, "/v1/chat/completions", {"model": RERANKER, "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}]}, status=400)  # fmt: skip
    assert "is a reranker" in chat["error"]["message"]
    generate = http.post("/api/generate", json={"model": RERANKER, "prompt": "hi",
                                                "stream": False})  # fmt: skip
    assert generate.status_code == 400 and "is a reranker" in generate.json()["error"]
    embed = post(http, "/v1/embeddings", {"model": RERANKER, "input": "hi"}, status=400)
    assert "is a reranker" in embed["error"]["message"]


def test_the_catalog_says_which_model_ranks(http):
    show = post(http, "/api/show", {"model": RERANKER})
    assert show["capabilities"] == ["rerank"]
    assert "completion" in post(http, "/api/show", {"model": CHAT})["capabilities"]
    listed = {m["id"]: m for m in http.get("/v1/models").json()["data"]}
    assert listed[RERANKER]["capabilities"] == ["rerank"]


def test_reranking_needs_a_valid_key(served):
    appliance, _ = served
    body = {"model": RERANKER, "query": QUERY, "documents": DOCUMENTS}
    for path in ("/v1/rerank", "/rerank", "/reranking"):
        assert httpx.post(appliance.url + path, json=body).status_code == 401
        wrong = httpx.post(appliance.url + path, json=body,
                           headers={"Authorization": "Bearer nope"})  # fmt: skip
        assert wrong.status_code == 401


def test_metrics_count_the_documents_ranked(http, expected):
    from prometheus_client.parser import text_string_to_metric_families

    names = ("appliance_reranked_documents", "appliance_reranked_tokens")

    def counted() -> dict[str, float]:
        families = text_string_to_metric_families(http.get("/metrics").text)
        return {family.name: sum(s.value for s in family.samples if s.labels["model"] == RERANKER)
                for family in families if family.name in names}  # fmt: skip

    before = counted()
    post(http, "/v1/rerank", {"model": RERANKER, "query": QUERY, "documents": DOCUMENTS})
    after = counted()
    assert after["appliance_reranked_documents"] - before["appliance_reranked_documents"] == 4
    tokens = sum(e["tokens"] for e in expected)
    assert after["appliance_reranked_tokens"] - before["appliance_reranked_tokens"] == tokens
