"""The LAN API (OpenAI- and Ollama-compatible, /metrics, the OpenAPI description) and the
page that manages its keys."""

from django.urls import path, re_path

from dashboard.api import (
    embed_views,
    keys_views,
    metrics,
    ollama_views,
    openai_views,
    openapi,
    pull_views,
)
from dashboard.api.errors import unknown_endpoint

urlpatterns = [
    # OpenAI
    path("v1/models", openai_views.list_models, name="openai_models"),
    path("v1/models/<path:model_id>", openai_views.retrieve_model, name="openai_model"),
    path("v1/chat/completions", openai_views.chat_completions, name="openai_chat"),
    path("v1/completions", openai_views.completions, name="openai_completions"),
    path("v1/embeddings", embed_views.openai_embeddings, name="openai_embeddings"),
    # Ollama
    path("api/version", ollama_views.api_version, name="ollama_version"),
    path("api/tags", ollama_views.tags, name="ollama_tags"),
    path("api/ps", ollama_views.ps, name="ollama_ps"),
    path("api/show", ollama_views.show_model, name="ollama_show"),
    path("api/chat", ollama_views.chat, name="ollama_chat"),
    path("api/generate", ollama_views.generate, name="ollama_generate"),
    path("api/delete", ollama_views.delete_model, name="ollama_delete"),
    path("api/pull", pull_views.pull, name="ollama_pull"),
    path("api/embed", embed_views.ollama_embed, name="ollama_embed"),
    path("api/embeddings", embed_views.ollama_embeddings, name="ollama_embeddings"),
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
