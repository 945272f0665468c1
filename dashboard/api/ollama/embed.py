"""Ollama's embedding endpoints: /api/embed (vectors of length 1; an empty input loads the
model) and /api/embeddings, its older endpoint (one prompt's raw pooled vector). The steps are
dashboard.api.embedding's, shared with OpenAI's /v1/embeddings."""

from django.http import HttpRequest, JsonResponse

from dashboard.api import pipeline
from dashboard.api.auth import api_endpoint, granted_keep_alive
from dashboard.api.bodies import parse_body
from dashboard.api.embedding import check_dimensions, embed, load_only, since_arrival_ns
from dashboard.api.ollama.schemas import OllamaEmbeddingsRequest, OllamaEmbedRequest

ollama_post = api_endpoint(dialect="ollama", methods=("POST",))


@ollama_post
async def api_embed(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, OllamaEmbedRequest)
    model = await pipeline.resolve_model(body.model)
    check_dimensions(body.dimensions, model.embedding_length)
    keep_alive = granted_keep_alive(request.api_key, model, body.keep_alive)
    if not body.inputs:
        loading = await load_only(request, model, keep_alive)
        return JsonResponse(
            {
                "model": body.model,
                "embeddings": [],
                "total_duration": since_arrival_ns(),
                "load_duration": int(loading * 1e9),
                "prompt_eval_count": 0,
            }
        )
    result = await embed(model, body.inputs, truncate=body.truncate, keep_alive=keep_alive)
    check_dimensions(body.dimensions, result.embedding.dim)
    return JsonResponse({
        "model": body.model,
        "embeddings": result.embedding.vectors(normalised=True),
        "total_duration": since_arrival_ns(),
        "load_duration": int(result.load_seconds * 1e9),
        "prompt_eval_count": result.embedding.prompt_tokens,
    })  # fmt: skip


@ollama_post
async def api_embeddings(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, OllamaEmbeddingsRequest)
    model = await pipeline.resolve_model(body.model)
    keep_alive = granted_keep_alive(request.api_key, model, body.keep_alive)
    if not body.prompt:
        await load_only(request, model, keep_alive)
        return JsonResponse({"embedding": []})
    # Ollama's older endpoint does not truncate: an over-long prompt is a 400.
    result = await embed(model, [body.prompt], truncate=False, keep_alive=keep_alive)
    return JsonResponse({"embedding": result.embedding.vectors(normalised=False)[0]})
