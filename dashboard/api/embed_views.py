"""Embedding endpoints: Ollama's /api/embed and /api/embeddings, OpenAI's /v1/embeddings.

Any registered model embeds, in its runner process (inference.serving.embeds): a text is
tokenized with the model's own tokenizer and pooled the model's way (mean where the GGUF names
none). /api/embed and /v1/embeddings give vectors of Euclidean length 1, as Ollama and OpenAI
do; /api/embeddings, Ollama's older endpoint, gives the raw pooled vector, as Ollama does.
`dimensions` other than the model's own is refused: a vector can only be cut shorter for models
trained for it, and nothing in a GGUF says whether this one was.

An empty Ollama input only loads the model, as in Ollama; like /api/generate's empty prompt,
that needs a key with the manage scope. A chat key's keep_alive is clamped as for generation.
"""

import dataclasses
import time

from django.http import HttpRequest, JsonResponse

from appliance.arrival import arrived_wall
from dashboard.api.auth import api_endpoint, require_scope
from dashboard.api.embed_schemas import (
    OllamaEmbeddingsRequest,
    OllamaEmbedRequest,
    OpenAIEmbeddingRequest,
)
from dashboard.api.errors import from_event, invalid
from dashboard.api.ollama_views import _granted_keep_alive
from dashboard.api.runs import resolve_model
from dashboard.api.schemas import parse_body
from dashboard.models import ApiKey
from inference.catalog.specs import spec_for
from inference.models import LLMModel
from inference.serving.client import get_client
from inference.serving.embeds import EmbedError, EmbedJob, EmbedResult

ollama_post = api_endpoint(dialect="ollama", methods=("POST",))
openai_post = api_endpoint(dialect="openai", methods=("POST",))


async def _embed(
    model: LLMModel, inputs: list, *, truncate: bool, keep_alive: float | None = None
) -> EmbedResult:
    job = EmbedJob(model.name, inputs, truncate=truncate, keep_alive=keep_alive)
    try:
        return await get_client().embed(job, spec_for(model))
    except EmbedError as exc:
        raise from_event(exc.event) from None


def _check_dimensions(asked: int | None, dim: int | None) -> None:
    if asked is not None and dim is not None and asked != dim:
        raise invalid(
            f"dimensions: this model's embeddings have {dim} dimensions; other sizes are not "
            "supported (leave dimensions out, or send the model's own)", "dimensions",
        )  # fmt: skip


async def _load_only(request: HttpRequest, model: LLMModel, keep_alive: float | None) -> float:
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


def _since_arrival_ns() -> int:
    arrived = arrived_wall()
    return int(max(0.0, time.time() - arrived) * 1e9) if arrived is not None else 0


@ollama_post
async def ollama_embed(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, OllamaEmbedRequest)
    model = await resolve_model(body.model)
    _check_dimensions(body.dimensions, model.embedding_length)
    keep_alive = _granted_keep_alive(request.api_key, model, body.keep_alive)
    if not body.inputs:
        loading = await _load_only(request, model, keep_alive)
        return JsonResponse(
            {
                "model": body.model,
                "embeddings": [],
                "total_duration": _since_arrival_ns(),
                "load_duration": int(loading * 1e9),
                "prompt_eval_count": 0,
            }
        )
    result = await _embed(model, body.inputs, truncate=body.truncate, keep_alive=keep_alive)
    _check_dimensions(body.dimensions, result.embedding.dim)
    return JsonResponse({
        "model": body.model,
        "embeddings": result.embedding.vectors(normalised=True),
        "total_duration": _since_arrival_ns(),
        "load_duration": int(result.load_seconds * 1e9),
        "prompt_eval_count": result.embedding.prompt_tokens,
    })  # fmt: skip


@ollama_post
async def ollama_embeddings(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, OllamaEmbeddingsRequest)
    model = await resolve_model(body.model)
    keep_alive = _granted_keep_alive(request.api_key, model, body.keep_alive)
    if not body.prompt:
        await _load_only(request, model, keep_alive)
        return JsonResponse({"embedding": []})
    # Ollama's older endpoint does not truncate: an over-long prompt is a 400.
    result = await _embed(model, [body.prompt], truncate=False, keep_alive=keep_alive)
    return JsonResponse({"embedding": result.embedding.vectors(normalised=False)[0]})


@openai_post
async def openai_embeddings(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, OpenAIEmbeddingRequest)
    inputs = body.inputs
    model = await resolve_model(body.model)
    _check_dimensions(body.dimensions, model.embedding_length)
    # OpenAI refuses an input over the model's limit rather than cutting it.
    result = await _embed(model, inputs, truncate=False)
    embedding = result.embedding
    _check_dimensions(body.dimensions, embedding.dim)
    if body.encoding_format == "base64":
        vectors = [embedding.base64(i, normalised=True) for i in range(embedding.count)]
    else:
        vectors = embedding.vectors(normalised=True)
    tokens = embedding.prompt_tokens
    return JsonResponse({
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": v}
                 for i, v in enumerate(vectors)],
        "model": model.name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    })  # fmt: skip
