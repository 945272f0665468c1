"""Embeddings, the steps the dialects share (OpenAI's /v1/embeddings in openai/, Ollama's
/api/embed and /api/embeddings in ollama/), and the bounds their bodies share.

Any registered model but a reranker embeds, in its runner process (inference.serving.embeds; a
reranker scores documents on the same path instead: dashboard.api.rerank): a text is
tokenized with the model's own tokenizer and pooled the model's way (mean where the GGUF names
none). /api/embed and /v1/embeddings give vectors of Euclidean length 1, as Ollama and OpenAI
do; /api/embeddings, Ollama's older endpoint, gives the raw pooled vector, as Ollama does.
`dimensions` other than the model's own is refused: a vector can only be cut shorter for models
trained for it, and nothing in a GGUF says whether this one was.

Bounded before anything reaches a runner: at most MAX_INPUTS inputs, each text at most
MAX_CONTENT_CHARS characters and all of them MAX_PROMPT_CHARS, each token array at most
MAX_TOKENS_PER_ARRAY non-negative ids. Whether an id is in the model's vocabulary, and how many
tokens a text is, only the runner knows: it checks those (inference.engine.embedding).

An empty Ollama input only loads the model, as in Ollama; like /api/generate's empty prompt,
that needs a key with the manage scope. A chat key's keep_alive is clamped as for generation.
"""

import dataclasses
import time
from typing import Annotated

from django.http import HttpRequest
from pydantic import AfterValidator, Field

from appliance.arrival import arrived_wall
from dashboard.api.auth import require_scope
from dashboard.api.bodies import MAX_CONTENT_CHARS, MAX_PROMPT_CHARS
from dashboard.api.errors import from_event, invalid
from dashboard.models import ApiKey
from inference.catalog.specs import spec_for
from inference.engine.embedding import MAX_INPUTS, MAX_TOTAL_TOKENS
from inference.models import LLMModel
from inference.serving.client import get_client
from inference.serving.embeds import EmbedError, EmbedJob, EmbedResult

MAX_TOKENS_PER_ARRAY = 1 << 16
MAX_DIMENSIONS = 1 << 16

EmbedText = Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]
TokenId = Annotated[int, Field(ge=0, le=(1 << 31) - 1)]
TokenArray = Annotated[list[TokenId], Field(min_length=1, max_length=MAX_TOKENS_PER_ARRAY)]
Dimensions = Annotated[int, Field(ge=1, le=MAX_DIMENSIONS)]


def _total_chars(texts: list[str]) -> list[str]:
    total = sum(len(t) for t in texts)
    if total > MAX_PROMPT_CHARS:
        raise ValueError(f"the inputs are {total} characters together, over {MAX_PROMPT_CHARS}")
    return texts


def _total_tokens(arrays: list[list[int]]) -> list[list[int]]:
    total = sum(len(a) for a in arrays)
    if total > MAX_TOTAL_TOKENS:
        raise ValueError(f"the inputs are {total} tokens together, over {MAX_TOTAL_TOKENS}")
    return arrays


TextList = Annotated[list[EmbedText], Field(max_length=MAX_INPUTS), AfterValidator(_total_chars)]
TokenArrays = Annotated[
    list[TokenArray], Field(min_length=1, max_length=MAX_INPUTS), AfterValidator(_total_tokens)
]



async def embed(
    model: LLMModel, inputs: list, *, truncate: bool, keep_alive: float | None = None,
    query: str | None = None, truncate_left: bool = False,
) -> EmbedResult:
    """The vectors of `inputs`, or with a `query` a reranker's score of each
    (dashboard.api.rerank)."""
    job = EmbedJob(model.name, inputs, truncate=truncate, keep_alive=keep_alive, query=query,
                   truncate_left=truncate_left)  # fmt: skip
    try:
        return await get_client().embed(job, spec_for(model))
    except EmbedError as exc:
        raise from_event(exc.event) from None


def check_dimensions(asked: int | None, dim: int | None) -> None:
    if asked is not None and dim is not None and asked != dim:
        raise invalid(
            f"dimensions: this model's embeddings have {dim} dimensions; other sizes are not "
            "supported (leave dimensions out, or send the model's own)", "dimensions",
        )  # fmt: skip


async def load_only(request: HttpRequest, model: LLMModel, keep_alive: float | None) -> float:
    """An empty input: load the model (Ollama's way to warm it up); seconds it took."""
    require_scope(request.api_key, ApiKey.Scope.MANAGE, "loading a model with an empty input")
    started = time.perf_counter()
    spec = spec_for(model)
    if keep_alive is not None:
        spec = dataclasses.replace(spec, keep_alive=keep_alive)
    try:
        await get_client().load(spec)
    except Exception as exc:  # noqa: BLE001 - a refused load is an error status
        raise from_event(EmbedError.of("", exc).event) from None
    return time.perf_counter() - started


def since_arrival_ns() -> int:
    arrived = arrived_wall()
    return int(max(0.0, time.time() - arrived) * 1e9) if arrived is not None else 0
