"""The OpenAPI 3.1 description of the LAN API, served at /api/openapi.json.

Request bodies come from the pydantic models that validate them (model_json_schema), so the
description cannot drift from what the endpoints accept. Responses are described by their
required fields only: the OpenAI and Ollama shapes carry more, and clients add fields over time.
"""

import functools

from django.http import HttpRequest, JsonResponse
from pydantic.json_schema import models_json_schema

from dashboard.api import rerank
from dashboard.api.anthropic import schemas as anthropic
from dashboard.api.auth import api_endpoint
from dashboard.api.llama_server import completion as llama_completion
from dashboard.api.llama_server import infill
from dashboard.api.llama_server import views as llama_server
from dashboard.api.ollama import schemas as ollama
from dashboard.api.openai import schemas as openai
from dashboard.api.responses import schemas as responses

REF = "#/components/schemas/{model}"
BODIES = {
    "ChatCompletionRequest": openai.ChatCompletionRequest,
    "CompletionRequest": openai.CompletionRequest,
    "ResponsesRequest": responses.ResponsesRequest,
    "OllamaChatRequest": ollama.OllamaChatRequest,
    "OllamaGenerateRequest": ollama.OllamaGenerateRequest,
    "OllamaModelRequest": ollama.OllamaModelRequest,
    "OllamaPullRequest": ollama.OllamaPullRequest,
    "OllamaCreateRequest": ollama.OllamaCreateRequest,
    "OllamaCopyRequest": ollama.OllamaCopyRequest,
    "OpenAIEmbeddingRequest": openai.OpenAIEmbeddingRequest,
    "OllamaEmbedRequest": ollama.OllamaEmbedRequest,
    "OllamaEmbeddingsRequest": ollama.OllamaEmbeddingsRequest,
    "MessagesRequest": anthropic.MessagesRequest,
    "CountTokensRequest": anthropic.CountTokensRequest,
    "TokenizeRequest": llama_server.TokenizeRequest,
    "DetokenizeRequest": llama_server.DetokenizeRequest,
    "InfillRequest": infill.InfillRequest,
    "LlamaCompletionRequest": llama_completion.LlamaCompletionRequest,
    "RerankRequest": rerank.RerankRequest,
}

_OBJECT = {"type": "object"}
MODEL_REF = REF.format(model="Model")
RESPONSES = {
    "OpenAIError": {
        "type": "object", "required": ["error"],
        "properties": {"error": {
            "type": "object", "required": ["message", "type"],
            "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                           "param": {"type": ["string", "null"]},
                           "code": {"type": ["string", "null"]}},
        }},
    },
    "OllamaError": {"type": "object", "required": ["error"],
                    "properties": {"error": {"type": "string"}}},
    "AnthropicError": {
        "type": "object", "required": ["type", "error"],
        "properties": {"type": {"const": "error"}, "error": {
            "type": "object", "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        }},
    },
    "Message": {"type": "object",
                "required": ["id", "type", "role", "model", "content", "stop_reason", "usage"],
                "properties": {"type": {"const": "message"}, "role": {"const": "assistant"},
                               "content": {"type": "array", "items": _OBJECT},
                               "usage": _OBJECT, "timings": _OBJECT}},
    "TokenCount": {"type": "object", "required": ["input_tokens"],
                   "properties": {"input_tokens": {"type": "integer", "minimum": 0}}},
    "Tokens": {"type": "object", "required": ["model", "tokens"],
               "properties": {"tokens": {"type": "array"}}},
    "Detokenized": {"type": "object", "required": ["model", "content"],
                    "properties": {"content": {"type": "string"}}},
    # No field is required: response_fields may leave any out.
    "Infilled": {"type": "object",
                 "properties": {"content": {"type": "string"}, "stop_type": {
                     "enum": ["eos", "limit", "word"]},
                     "tokens_evaluated": {"type": "integer", "minimum": 0},
                     "tokens_predicted": {"type": "integer", "minimum": 0},
                     "timings": _OBJECT}},
    "AppliedTemplate": {"type": "object", "required": ["model", "prompt"],
                        "properties": {"prompt": {"type": "string"}}},
    "LlamaCompletion": {"type": "object",
                        "required": ["content", "stop", "tokens_predicted", "tokens_evaluated"],
                        "properties": {"content": {"type": "string"}, "stop": {"type": "boolean"},
                                       "stop_type": {"enum": ["eos", "word", "limit", "none"]},
                                       "timings": _OBJECT}},
    "Props": {"type": "object",
              "required": ["default_generation_settings", "total_slots", "model_path",
                           "modalities", "chat_template"],
              "properties": {"modalities": {"type": "object", "properties": {
                  "vision": {"type": "boolean"}}}}},
    "ModelList": {"type": "object", "required": ["object", "data"],
                  "properties": {"object": {"const": "list"},
                                 "data": {"type": "array", "items": {"$ref": MODEL_REF}}}},
    "Model": {"type": "object", "required": ["id", "object", "created", "owned_by"],
              "properties": {"id": {"type": "string"}, "object": {"const": "model"},
                             "created": {"type": "integer"}, "owned_by": {"type": "string"},
                             # What it takes and gives (llama-server's shape): image for a
                             # model with a vision projector.
                             "architecture": {"type": "object", "properties": {
                                 "input_modalities": {"type": "array",
                                                      "items": {"enum": ["text", "image"]}},
                                 "output_modalities": {"type": "array",
                                                       "items": {"const": "text"}}}}}},
    "Completion": {"type": "object", "required": ["id", "object", "created", "model", "choices"],
                   "properties": {"choices": {"type": "array", "items": _OBJECT},
                                  "usage": _OBJECT, "timings": _OBJECT}},
    "Response": {"type": "object",
                 "required": ["id", "object", "created_at", "status", "model", "output"],
                 "properties": {"object": {"const": "response"},
                                "status": {"enum": ["completed", "incomplete"]},
                                "output": {"type": "array", "items": _OBJECT},
                                "usage": _OBJECT, "timings": _OBJECT}},
    "OllamaAnswer": {"type": "object", "required": ["model", "created_at", "done"],
                     "properties": {"done": {"type": "boolean"}, "done_reason": {"type": "string"},
                                    "total_duration": {"type": "integer", "minimum": 0},
                                    "eval_count": {"type": "integer", "minimum": 0},
                                    "timings": _OBJECT}},
    "OllamaModels": {"type": "object", "required": ["models"],
                     "properties": {"models": {"type": "array", "items": _OBJECT}}},
    "OllamaShow": {"type": "object", "required": ["details", "model_info", "capabilities"]},
    "OllamaVersion": {"type": "object", "required": ["version"],
                      "properties": {"version": {"type": "string"}}},
    "Status": {"type": "object", "required": ["status"]},
    "EmbeddingList": {"type": "object", "required": ["object", "data", "model", "usage"],
                      "properties": {"object": {"const": "list"},
                                     "data": {"type": "array", "items": _OBJECT},
                                     "usage": _OBJECT}},
    # Cohere's and Jina's object, or TEI's bare array when the body sent `texts`.
    "Ranking": {"oneOf": [
        {"type": "object", "required": ["model", "object", "usage", "results"],
         "properties": {"object": {"const": "list"}, "usage": _OBJECT, "results": {
             "type": "array", "items": {"type": "object", "required": ["index",
                                                                       "relevance_score"]}}}},
        {"type": "array", "items": {"type": "object", "required": ["index", "score"]}},
    ]},
    "OllamaEmbeddings": {"type": "object", "required": ["model", "embeddings"],
                         "properties": {"embeddings": {"type": "array", "items": {
                             "type": "array", "items": {"type": "number"}}},
                             "prompt_eval_count": {"type": "integer", "minimum": 0}}},
    "OllamaEmbedding": {"type": "object", "required": ["embedding"],
                        "properties": {"embedding": {"type": "array",
                                                     "items": {"type": "number"}}}},
}  # fmt: skip

_STATUS_TEXT = {
    400: "invalid request: the message names the field",
    401: "missing, invalid or revoked API key",
    403: "the key's scope does not allow this",
    404: "unknown model",
    409: "the model is answering a request",
    413: "request body too large",
    429: "rate limit or engine queue full: see Retry-After",
    502: "the registry could not be reached, or sent something that is not the model",
    501: "not supported by the appliance",
    503: "the engine is unavailable or the model could not be loaded",
    507: "the model (with the context asked, Ollama's num_ctx) does not fit in free memory",
}


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _errors(dialect: str, codes: tuple[int, ...]) -> dict:
    schema = _ref({"openai": "OpenAIError", "anthropic": "AnthropicError"}.get(dialect,
                                                                             "OllamaError"))
    out = {}
    for code in codes:
        out[str(code)] = {"description": _STATUS_TEXT[code],
                          "content": {"application/json": {"schema": schema}}}  # fmt: skip
        if code == 429:
            out[str(code)]["headers"] = {"Retry-After": {"schema": {"type": "integer"}}}
    return out


def _operation(summary: str, dialect: str, ok: dict, *, body: str | None = None,
               errors: tuple[int, ...] = (401, 429), tag: str) -> dict:  # fmt: skip
    operation = {
        "summary": summary,
        "tags": [tag],
        "responses": {"200": {"description": "OK", "content": ok}, **_errors(dialect, errors)},
    }
    if body:
        content = {"application/json": {"schema": _ref(body)}}
        operation["requestBody"] = {"required": True, "content": content}
    return operation


def _json(name: str) -> dict:
    return {"application/json": {"schema": _ref(name)}}


_GENERATION_ERRORS = (400, 401, 404, 413, 429, 503, 507)
# An empty prompt loads or unloads the model, which needs the manage scope.
_OLLAMA_GENERATION_ERRORS = (400, 401, 403, 404, 413, 429, 503, 507)


@functools.cache
def build() -> dict:
    _, definitions = models_json_schema(
        [(model, "validation") for model in BODIES.values()], ref_template=REF
    )
    components = {**definitions.get("$defs", {}), **RESPONSES}
    sse = {**_json("Completion"), "text/event-stream": {"schema": {"type": "string"}}}
    lines = {**_json("OllamaAnswer"), "application/x-ndjson": {"schema": {"type": "string"}}}
    o, ol = "openai", "ollama"
    paths = {
        "/v1/models": {"get": _operation("List models", o, _json("ModelList"), tag="OpenAI")},
        "/v1/models/{model_id}": {
            "get": {**_operation("One model", o, _json("Model"), errors=(401, 404, 429),
                                 tag="OpenAI"),
                    "parameters": [{"name": "model_id", "in": "path", "required": True,
                                    "schema": {"type": "string", "minLength": 1}}]},
        },
        "/v1/chat/completions": {"post": _operation(
            "Chat completion, streamed as server-sent events with stream: true", o, sse,
            body="ChatCompletionRequest", errors=_GENERATION_ERRORS, tag="OpenAI")},
        "/v1/completions": {"post": _operation(
            "Text completion of a raw prompt", o, sse, body="CompletionRequest",
            errors=_GENERATION_ERRORS, tag="OpenAI")},
        "/v1/responses": {"post": _operation(
            "Responses API (stateless: previous_response_id is a 400), streamed as named "
            "server-sent events with stream: true", o,
            {**_json("Response"), "text/event-stream": {"schema": {"type": "string"}}},
            body="ResponsesRequest", errors=_GENERATION_ERRORS, tag="OpenAI")},
        "/v1/embeddings": {"post": _operation(
            "Embeddings (length 1) of strings or token arrays, as float or base64", o,
            _json("EmbeddingList"), body="OpenAIEmbeddingRequest", errors=_GENERATION_ERRORS,
            tag="OpenAI")},
        "/api/embed": {"post": _operation(
            "Embeddings (length 1) of a string or a list; an empty input loads the model", ol,
            _json("OllamaEmbeddings"), body="OllamaEmbedRequest",
            errors=_OLLAMA_GENERATION_ERRORS, tag="Ollama")},
        "/api/embeddings": {"post": _operation(
            "One prompt's raw embedding (Ollama's older endpoint)", ol,
            _json("OllamaEmbedding"), body="OllamaEmbeddingsRequest",
            errors=_OLLAMA_GENERATION_ERRORS, tag="Ollama")},
        "/api/tags": {"get": _operation("Registered models", ol, _json("OllamaModels"),
                                        tag="Ollama")},
        "/api/ps": {"get": _operation("Loaded models", ol, _json("OllamaModels"), tag="Ollama")},
        "/api/show": {"post": _operation("A model's details", ol, _json("OllamaShow"),
                                         body="OllamaModelRequest",
                                         errors=(400, 401, 404, 413, 429),
                                         tag="Ollama")},
        "/api/chat": {"post": _operation(
            "Chat, streamed as NDJSON unless stream: false", ol, lines,
            body="OllamaChatRequest", errors=_OLLAMA_GENERATION_ERRORS, tag="Ollama")},
        "/api/generate": {"post": _operation(
            "Generate from a prompt, streamed as NDJSON unless stream: false", ol, lines,
            body="OllamaGenerateRequest", errors=_OLLAMA_GENERATION_ERRORS, tag="Ollama")},
        "/api/version": {"get": _operation("API version", ol, _json("OllamaVersion"),
                                           tag="Ollama")},
        "/api/delete": {"delete": _operation(
            "Delete a model (admin keys only)", ol, _json("Status"), body="OllamaModelRequest",
            errors=(400, 401, 403, 404, 409, 413, 429, 503), tag="Ollama")},
        "/api/pull": {"post": _operation(
            "Pull a model by name from a registry (admin keys only), progress streamed as "
            "NDJSON unless stream: false", ol,
            {**_json("Status"), "application/x-ndjson": {"schema": {"type": "string"}}},
            body="OllamaPullRequest", errors=(400, 401, 403, 404, 409, 413, 429, 502),
            tag="Ollama")},
        "/api/create": {"post": _operation(
            "Make a model from an uploaded blob (files) or derive one from a model (from), "
            "with its own system, parameters, template and messages (admin keys only); "
            "progress as NDJSON unless stream: false", ol,
            {**_json("Status"), "application/x-ndjson": {"schema": {"type": "string"}}},
            body="OllamaCreateRequest", errors=(400, 401, 403, 404, 409, 413, 429),
            tag="Ollama")},
        "/api/copy": {"post": _operation(
            "Another name for a model (admin keys only)", ol, _json("Status"),
            body="OllamaCopyRequest",
            errors=(400, 401, 403, 404, 409, 413, 429), tag="Ollama")},
        "/api/push": {"post": {**_operation(
            "Not supported: the appliance publishes no models", ol, {},
            errors=(401, 403, 413, 429, 501), tag="Ollama"),
            "requestBody": {"content": {"application/json": {"schema": _OBJECT}}}}},
        "/api/blobs/{digest}": {
            "parameters": [{"name": "digest", "in": "path", "required": True,
                            "schema": {"type": "string", "pattern": "^sha256:[0-9a-f]{64}$"}}],
            "head": {"summary": "200 when the blob (or a model with its bytes) is here, else "
                     "404 (admin keys only)", "tags": ["Ollama"],
                     "responses": {str(code): {"description": text} for code, text in (
                         (200, "present"), (404, "not here"), (401, _STATUS_TEXT[401]),
                         (403, _STATUS_TEXT[403]), (429, _STATUS_TEXT[429]))}},
            "post": {**_operation(
                "Upload a GGUF by its sha256 (admin keys only): streamed to the models "
                "directory, verified, checked as a GGUF; 201 when kept", ol, {},
                errors=(400, 401, 403, 409, 413, 429, 507), tag="Ollama"),
                "requestBody": {"required": True, "content": {
                    "application/octet-stream": {"schema": {"type": "string",
                                                            "format": "binary"}}}}},
        },
        "/v1/messages": {"post": _operation(
            "Anthropic Messages, streamed as named server-sent events with stream: true; the "
            "key as x-api-key or Bearer", "anthropic",
            {**_json("Message"), "text/event-stream": {"schema": {"type": "string"}}},
            body="MessagesRequest", errors=_GENERATION_ERRORS, tag="Anthropic")},
        "/v1/messages/count_tokens": {"post": _operation(
            "The prompt tokens /v1/messages would send for this conversation", "anthropic",
            _json("TokenCount"), body="CountTokensRequest", errors=_GENERATION_ERRORS,
            tag="Anthropic")},
        "/tokenize": {"post": _operation(
            "The model's token ids of a text (llama-server's), with their pieces if asked", o,
            _json("Tokens"), body="TokenizeRequest", errors=_GENERATION_ERRORS,
            tag="Tokenizer")},
        "/detokenize": {"post": _operation(
            "The text of token ids (llama-server's)", o, _json("Detokenized"),
            body="DetokenizeRequest", errors=_GENERATION_ERRORS, tag="Tokenizer")},
        "/apply-template": {"post": _operation(
            "A chat completions body's messages rendered through the model's template "
            "(llama-server's)", o, _json("AppliedTemplate"), body="ChatCompletionRequest",
            errors=(400, 401, 404, 413, 429), tag="Tokenizer")},
        "/infill": {"post": _operation(
            "Code to fill in between a prefix and a suffix, with other files' chunks as "
            "context (llama-server's, for editors)", o,
            {**_json("Infilled"), "text/event-stream": {"schema": {"type": "string"}}},
            body="InfillRequest", errors=_GENERATION_ERRORS, tag="Completions")},
        "/completion": {"post": _operation(
            "llama-server's completion of a prompt sent as is (text or token ids), streamed as "
            "server-sent events with stream: true", o,
            {**_json("LlamaCompletion"), "text/event-stream": {"schema": {"type": "string"}}},
            body="LlamaCompletionRequest", errors=_GENERATION_ERRORS, tag="llama-server")},
        "/props": {"get": {**_operation(
            "llama-server's properties of a model (the default one, or ?model=)", o,
            _json("Props"), errors=(401, 404, 429), tag="llama-server"),
            "parameters": [{"name": "model", "in": "query", "required": False,
                            "schema": {"type": "string"}}]}},
        **{path: {"post": _operation(
            "Scores of documents against a query by a reranker, best first (llama-server's "
            "route; Cohere's and Jina's body, or TEI's with texts)", o, _json("Ranking"),
            body="RerankRequest", errors=_GENERATION_ERRORS, tag="Reranking")}
           for path in ("/v1/rerank", "/v1/reranking", "/rerank", "/reranking")},
        "/metrics": {"get": _operation(
            "Prometheus metrics (a key is needed unless METRICS_PUBLIC)", o,
            {"text/plain": {"schema": {"type": "string"}}}, tag="Monitoring")},
        "/api/openapi.json": {"get": {
            "summary": "This description", "tags": ["Monitoring"], "security": [],
            "responses": {"200": {"description": "OK", "content": {"application/json": {
                "schema": {"type": "object"}}}}},
        }},
    }  # fmt: skip
    upload = paths["/api/blobs/{digest}"]["post"]["responses"]
    upload["201"] = {"description": "the blob is kept"}
    del upload["200"]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Home-lab appliance LAN API",
            "version": "1",
            "description": "OpenAI-, Ollama- and Anthropic-compatible endpoints for home apps, "
            "and llama-server's own (/completion, /props, its tokenizer). Every endpoint but "
            "this description needs `Authorization: Bearer <key>` (or `x-api-key: <key>`).",
        },
        "servers": [{"url": "/"}],
        # x-api-key (the anthropic client's header) is accepted everywhere too; it is described
        # as a scheme but not required as an alternative, so generated requests (the
        # schemathesis test) send the one bearer key.
        "security": [{"bearerAuth": []}],
        "components": {
            "schemas": components,
            "securitySchemes": {
                "bearerAuth": {"type": "http", "scheme": "bearer"},
                "apiKeyHeader": {"type": "apiKey", "in": "header", "name": "x-api-key"},
            },
        },
        "paths": paths,
    }


@api_endpoint(dialect="openai", public=lambda: True)
async def openapi_json(request: HttpRequest) -> JsonResponse:
    return JsonResponse(build())
