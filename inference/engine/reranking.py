"""Reranking: a reranker scores how well each document answers a query. It is an embedding
request of another kind, on the same path (inference.engine.embedding; runner.LlamaRunner.embed):
each (query, document) pair is one input, pooled by llama.cpp's rank pooling, and its score is
the pooled output's first element, as llama-server reads it. Pure Python, no llama.cpp.

    future = engine.embed(["doc one", "doc two"], truncate=False, query="the query")
    future.result().scores()  # one float per document, in the documents' order

Rules, checked once, in the runner's process (it has the vocabulary):
1. A reranker is a model whose GGUF says pooling type rank (`<arch>.pooling_type` = 4:
   bge-reranker, jina-reranker, Qwen3-Reranker). Only it ranks, and it does nothing else: a
   reranker asked for embeddings or text is refused, saying what it is.
2. A pair's tokens are llama-server's (tools/server, format_prompt_rerank): the GGUF's `rerank`
   chat template (tokenizer.chat_template.rerank) with {query} and {document} replaced,
   tokenized with special tokens parsed and none added; where it has none, BOS query EOS SEP
   document EOS, each special token only where the vocabulary says to add it (EOS falls back
   to SEP), the texts tokenized as plain text.
3. A pair longer than the runner's embedding limit is cut to it with truncate (from the end, or
   from the start with truncate_left) and refused otherwise (PromptTooLong), as embeddings are.
"""

from dataclasses import dataclass

from inference.engine.embedding import MAX_TOTAL_TOKENS, Embedding
from inference.engine.engine import PromptTooLong
from inference.engine.params import InvalidParams

MAX_DOCUMENTS = 1000  # per request; Cohere's own limit
RANK_POOLING = 4  # llama.cpp's LLAMA_POOLING_TYPE_RANK, as a GGUF's <arch>.pooling_type names it
NO_TOKEN = -1  # llama.cpp's LLAMA_TOKEN_NULL

NOT_A_RERANKER = ("this model is not a reranker: reranking needs a model whose GGUF says "
                  "pooling type rank (such as bge-reranker-v2-m3)")  # fmt: skip
IS_A_RERANKER = ("this model is a reranker: it scores documents against a query (POST /v1/rerank)"
                 " and gives no text or embeddings")  # fmt: skip


@dataclass(frozen=True, slots=True)
class PairLayout:
    """How a reranker's vocabulary joins a query and a document (rule 2), read at load."""

    template: str | None  # the GGUF's rerank template, with {query} and {document}
    bos: int = NO_TOKEN
    eos: int = NO_TOKEN
    sep: int = NO_TOKEN
    add_bos: bool = False
    add_eos: bool = False
    add_sep: bool = False


def pair_tokens(layout: PairLayout, query: str, document: str, tokenize) -> list[int]:
    """The tokens of one (query, document) pair (rule 2); `tokenize(text, add_special,
    parse_special)` is the runner's."""
    if layout.template is not None:
        text = layout.template.replace("{query}", query).replace("{document}", document)
        return tokenize(text, False, True)
    eos = layout.eos if layout.eos != NO_TOKEN else layout.sep
    ids = [layout.bos] if layout.add_bos else []
    ids += tokenize(query, False, False)
    if layout.add_eos:
        ids.append(eos)
    if layout.add_sep:
        ids.append(layout.sep)
    ids += tokenize(document, False, False)
    if layout.add_eos:
        ids.append(eos)
    return ids


def prepare(
    query: str, documents: list[str], runner, *, truncate: bool, truncate_left: bool = False
) -> list[list[int]]:
    """The token ids of each pair (rules 1 to 3). Raises InvalidParams or PromptTooLong, naming
    the document by its index."""
    if not getattr(runner, "ranks", False):
        raise InvalidParams("model", NOT_A_RERANKER)
    if not documents:
        raise InvalidParams("documents", "at least one document is needed")
    if len(documents) > MAX_DOCUMENTS:
        raise InvalidParams("documents", f"at most {MAX_DOCUMENTS} documents per request, "
                            f"got {len(documents)}")  # fmt: skip
    layout: PairLayout = runner.pair_layout
    limit = runner.embed_limit
    pairs = []
    total = 0
    for index, document in enumerate(documents):
        if not isinstance(document, str):
            raise InvalidParams("documents", f"document {index} is not a text")
        ids = pair_tokens(layout, query, document, runner.tokenize)
        if len(ids) > limit:
            if not truncate:
                raise PromptTooLong(
                    f"document {index} with the query is {len(ids)} tokens but this reranker "
                    f"holds {limit} tokens per pair (send truncate: true to cut it)"
                )
            ids = ids[-limit:] if truncate_left else ids[:limit]
        total += len(ids)
        if total > MAX_TOTAL_TOKENS:
            raise InvalidParams("documents", f"the pairs are over {MAX_TOTAL_TOKENS} tokens "
                                "together")  # fmt: skip
        pairs.append(ids)
    return pairs


def scores(ranking: Embedding) -> list[float]:
    """The score of each pair, in the documents' order: the first element of its pooled
    output (a reranker's runner pools one float per pair)."""
    return [ranking.floats(i, normalised=False)[0] for i in range(ranking.count)]
