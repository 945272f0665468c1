"""The LAN API: OpenAI's, the Responses API's, Anthropic's and Ollama's endpoints,
llama-server's own (/completion, /props and its tokenizer endpoints), /metrics and the OpenAPI
description."""

from django.urls import path, re_path

from dashboard.api import metrics, openapi, rerank
from dashboard.api.anthropic import views as anthropic
from dashboard.api.errors import unknown_endpoint
from dashboard.api.llama_server import completion, props
from dashboard.api.llama_server import views as llama_server
from dashboard.api.llama_server.infill import infill
from dashboard.api.ollama import create, embed, pull
from dashboard.api.ollama import views as ollama
from dashboard.api.openai import views as openai
from dashboard.api.responses import views as responses

# The API's paths outside /v1/ and /api/ (the gate holds them to their views' declarations too).
ROOT_PATHS = ("/metrics", "/tokenize", "/detokenize", "/apply-template", "/infill",
              "/completion", "/props")  # fmt: skip
ROOT_PATHS += ("/rerank", "/reranking")  # llama-server's reranking routes

urlpatterns = [
    # OpenAI
    path("v1/models", openai.list_models, name="openai_models"),
    path("v1/models/<path:model_id>", openai.retrieve_model, name="openai_model"),
    path("v1/chat/completions", openai.chat_completions, name="openai_chat"),
    path("v1/completions", openai.completions, name="openai_completions"),
    path("v1/responses", responses.responses, name="openai_responses"),
    path("v1/embeddings", openai.embeddings, name="openai_embeddings"),
    # Anthropic
    path("v1/messages", anthropic.messages, name="anthropic_messages"),
    path("v1/messages/count_tokens", anthropic.count_tokens, name="anthropic_count_tokens"),
    # Ollama
    path("api/version", ollama.api_version, name="ollama_version"),
    path("api/tags", ollama.tags, name="ollama_tags"),
    path("api/ps", ollama.ps, name="ollama_ps"),
    path("api/show", ollama.show_model, name="ollama_show"),
    path("api/chat", ollama.chat, name="ollama_chat"),
    path("api/generate", ollama.generate, name="ollama_generate"),
    path("api/delete", ollama.delete_model, name="ollama_delete"),
    path("api/pull", pull.pull, name="ollama_pull"),
    path("api/push", create.push, name="ollama_push"),
    path("api/create", create.create, name="ollama_create"),
    path("api/copy", create.copy, name="ollama_copy"),
    path("api/blobs/<str:digest>", create.blob, name="ollama_blob"),
    path("api/embed", embed.api_embed, name="ollama_embed"),
    path("api/embeddings", embed.api_embeddings, name="ollama_embeddings"),
    # llama-server's tokenizer endpoints
    path("tokenize", llama_server.tokenize, name="tokenize"),
    path("detokenize", llama_server.detokenize, name="detokenize"),
    path("apply-template", llama_server.apply_template, name="apply_template"),
    path("infill", infill, name="infill"),
    # llama-server's completion and properties
    path("completion", completion.completion, name="llama_completion"),
    path("props", props.get_props, name="llama_props"),
    # Reranking (llama-server's four paths; Cohere's, Jina's and TEI's bodies)
    path("v1/rerank", rerank.rerank, name="rerank"),
    path("v1/reranking", rerank.rerank, name="v1_reranking"),
    path("rerank", rerank.rerank, name="rerank_root"),
    path("reranking", rerank.rerank, name="reranking"),
    # Monitoring and description
    path("metrics", metrics.metrics, name="metrics"),
    path("api/openapi.json", openapi.openapi_json, name="openapi"),
    # Last: every other path of the dialects is a JSON 404 in its shape, not an HTML page.
    re_path(r"^v1/(?P<rest>.*)$", unknown_endpoint("openai")),
    re_path(r"^api/(?P<rest>.*)$", unknown_endpoint("ollama")),
]
