"""The LAN API (OpenAI- and Ollama-compatible, /metrics, the OpenAPI description) and the
page that manages its keys."""

from django.urls import path, re_path

from dashboard.api import (
    anthropic_views,
    create_views,
    embed_views,
    keys_views,
    metrics,
    ollama_views,
    openai_views,
    openapi,
    pull_views,
    responses_views,
    tokens,
)
from dashboard.api.errors import unknown_endpoint

# The API's paths outside /v1/ and /api/ (the gate holds them to their views' declarations too).
ROOT_PATHS = ("/metrics", "/tokenize", "/detokenize", "/apply-template")

urlpatterns = [
    # OpenAI
    path("v1/models", openai_views.list_models, name="openai_models"),
    path("v1/models/<path:model_id>", openai_views.retrieve_model, name="openai_model"),
    path("v1/chat/completions", openai_views.chat_completions, name="openai_chat"),
    path("v1/completions", openai_views.completions, name="openai_completions"),
    path("v1/responses", responses_views.responses, name="openai_responses"),
    path("v1/embeddings", embed_views.openai_embeddings, name="openai_embeddings"),
    # Anthropic
    path("v1/messages", anthropic_views.messages, name="anthropic_messages"),
    path(
        "v1/messages/count_tokens", anthropic_views.count_tokens, name="anthropic_count_tokens"
    ),
    # Ollama
    path("api/version", ollama_views.api_version, name="ollama_version"),
    path("api/tags", ollama_views.tags, name="ollama_tags"),
    path("api/ps", ollama_views.ps, name="ollama_ps"),
    path("api/show", ollama_views.show_model, name="ollama_show"),
    path("api/chat", ollama_views.chat, name="ollama_chat"),
    path("api/generate", ollama_views.generate, name="ollama_generate"),
    path("api/delete", ollama_views.delete_model, name="ollama_delete"),
    path("api/pull", pull_views.pull, name="ollama_pull"),
    path("api/push", create_views.push, name="ollama_push"),
    path("api/create", create_views.create, name="ollama_create"),
    path("api/copy", create_views.copy, name="ollama_copy"),
    path("api/blobs/<str:digest>", create_views.blob, name="ollama_blob"),
    path("api/embed", embed_views.ollama_embed, name="ollama_embed"),
    path("api/embeddings", embed_views.ollama_embeddings, name="ollama_embeddings"),
    # llama-server's tokenizer endpoints
    path("tokenize", tokens.tokenize, name="tokenize"),
    path("detokenize", tokens.detokenize, name="detokenize"),
    path("apply-template", tokens.apply_template, name="apply_template"),
    # Monitoring and description
    path("metrics", metrics.metrics, name="metrics"),
    path("api/openapi.json", openapi.openapi_json, name="openapi"),
    # The keys page
    path("api-keys/", keys_views.keys_page, name="api_keys"),
    path("api-keys/<int:key_id>/revoke/", keys_views.revoke_key, name="revoke_api_key"),
    path("api-keys/<int:key_id>/priority/", keys_views.set_key_priority,
         name="api_key_priority"),  # fmt: skip
    # Last: every other path of the two dialects is a JSON 404, not an HTML page.
    re_path(r"^v1/(?P<rest>.*)$", unknown_endpoint("openai")),
    re_path(r"^api/(?P<rest>.*)$", unknown_endpoint("ollama")),
]
