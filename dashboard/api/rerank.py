"""Reranking: /v1/rerank, /rerank, /v1/reranking and /reranking, as llama-server serves them.

A reranker (a GGUF whose pooling type is rank: LLMModel.is_reranker) scores each document
against the query in its runner, on the embeddings' path (dashboard.api.embedding.embed with a
query; inference.engine.reranking builds the pairs and says how). Two bodies, told apart by
`texts` as llama-server does:

- Cohere's and Jina's: {model, query, documents, top_n, return_documents}, each document a text
  or {"text": ...}; the answer is {model, object: "list", usage, results: [{index,
  relevance_score, document?: {text}}]}, best first, top_n of them.
- Text Embeddings Inference's: {query, texts, return_text, raw_scores, truncate,
  truncation_direction}; the answer is TEI's bare array [{index, score, text?}], best first.

Scores are llama.cpp's pooled output as llama-server gives it, in both shapes: `raw_scores` is
accepted and changes nothing (TEI would squash scores through a sigmoid without it; the order
is the same either way). An over-long pair is a 400 unless the body asks to truncate (TEI's
`truncate`). Counts and sizes are bounded here before anything reaches a runner; token counts
only the runner knows (inference.engine.reranking).
"""

from typing import Annotated, Literal

from django.http import HttpRequest, JsonResponse
from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from dashboard.api import pipeline
from dashboard.api.auth import api_endpoint
from dashboard.api.bodies import MAX_CONTENT_CHARS, MAX_PROMPT_CHARS, ModelName, Strict, parse_body
from dashboard.api.embedding import embed
from dashboard.api.errors import invalid
from inference.engine.reranking import MAX_DOCUMENTS, scores

post = api_endpoint(dialect="openai", methods=("POST",))

DocText = Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]


def _document_text(value):
    """Cohere's and Jina's documents may be {"text": ...} objects; the text is what is ranked."""
    if isinstance(value, dict) and set(value) == {"text"}:
        return value["text"]
    if isinstance(value, dict):
        raise ValueError('a document is a text or an object {"text": ...}')
    return value


def _total_chars(texts: list[str]) -> list[str]:
    total = sum(len(t) for t in texts)
    if total > MAX_PROMPT_CHARS:
        raise ValueError(f"the documents are {total} characters together, over {MAX_PROMPT_CHARS}")
    return texts


Documents = Annotated[
    list[Annotated[DocText, BeforeValidator(_document_text)]],
    Field(max_length=MAX_DOCUMENTS),
    AfterValidator(_total_chars),
]


class RerankRequest(Strict):
    model: ModelName = ""
    query: DocText
    documents: Documents | None = None  # Cohere, Jina
    texts: Documents | None = None  # TEI
    top_n: Annotated[int, Field(ge=1)] | None = None
    return_documents: bool = False  # Cohere, Jina
    return_text: bool = False  # TEI
    raw_scores: bool = False  # TEI; scores are always llama.cpp's (the module's docstring)
    truncate: bool = False  # TEI: cut an over-long pair instead of refusing it
    truncation_direction: Literal["right", "left", "Right", "Left"] = "right"

    @model_validator(mode="after")
    def one_list(self):
        if self.documents is not None and self.texts is not None:
            raise ValueError("send either documents or texts, not both")
        if not (self.documents or self.texts):
            field = "texts" if self.texts is not None else "documents"
            raise ValueError(f"{field} must be a non-empty list of texts")
        return self

    @property
    def tei(self) -> bool:
        return self.texts is not None

    @property
    def items(self) -> list[str]:
        return self.texts if self.texts is not None else self.documents


@post
async def rerank(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, RerankRequest)
    model = await pipeline.resolve_model(body.model)
    if not model.is_reranker:
        raise invalid(f'"{model.name}" is not a reranker: reranking needs a model whose GGUF '
                      "says pooling type rank (such as bge-reranker-v2-m3)", "model")  # fmt: skip
    texts = body.items
    result = await embed(model, texts, truncate=body.truncate, query=body.query,
                         truncate_left=body.truncation_direction.lower() == "left")  # fmt: skip
    ranked = sorted(enumerate(scores(result.embedding)), key=lambda pair: -pair[1])
    ranked = ranked[: body.top_n or len(ranked)]
    if body.tei:
        return JsonResponse(
            [{"index": i, "score": score, **({"text": texts[i]} if body.return_text else {})}
             for i, score in ranked], safe=False,
        )  # fmt: skip
    tokens = result.embedding.prompt_tokens
    return JsonResponse({
        "model": body.model or model.name,
        "object": "list",
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        "results": [{"index": i, "relevance_score": score,
                     **({"document": {"text": texts[i]}} if body.return_documents else {})}
                    for i, score in ranked],
    })  # fmt: skip
