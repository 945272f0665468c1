"""Ollama-compatible endpoints: /api/tags, /api/ps, /api/show, /api/chat, /api/generate,
/api/version and DELETE /api/delete (a name, a derived model, or a model with its file; the
making of models is ollama/create's, pulling ollama/pull's, embeddings ollama/embed's).

A generation goes through the answer pipeline (dashboard.api.pipeline); what is Ollama's is
written here: answers stream as NDJSON by default (`stream: false` gives one object); the last
line has `done: true`, the done reason, Ollama's timing fields in nanoseconds and `timings`
(dashboard.api.figures). An empty conversation or prompt loads the model (or, with keep_alive
0, unloads it), as Ollama does; that needs a key with the manage scope. A chat key's keep_alive
on a generation can shorten the model's own keep-alive but never lengthen or pin it
(dashboard.api.auth.granted_keep_alive).
"""

import dataclasses
import logging
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version

from asgiref.sync import sync_to_async
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from dashboard.api import pipeline
from dashboard.api.answer_parser import Piece
from dashboard.api.auth import api_endpoint, require_scope
from dashboard.api.bodies import parse_body
from dashboard.api.errors import ApiError, from_refusal
from dashboard.api.figures import ollama_durations, timings
from dashboard.api.logprobs import ollama_entries
from dashboard.api.ollama.schemas import (
    OllamaChatRequest,
    OllamaGenerateRequest,
    OllamaGenerationBase,
    OllamaModelRequest,
)
from dashboard.api.ollama.shapes import now_iso, process, show, tag, tag_names
from dashboard.api.pipeline import Answer, Ending
from dashboard.api.streaming import ndjson
from dashboard.models import ApiKey
from inference.catalog import operations
from inference.catalog.lookup import forget_name
from inference.catalog.specs import context_asked, spec_for
from inference.models import LLMModel
from inference.serving.client import get_client
from inference.serving.core import load_refusal

log = logging.getLogger(__name__)

# The Ollama API level these endpoints follow; clients that gate features on it read this.
OLLAMA_API_VERSION = "0.6.0"

ollama_get = api_endpoint(dialect="ollama")
ollama_post = api_endpoint(dialect="ollama", methods=("POST",))


def _appliance_version() -> str:
    try:
        return version("homelab-appliance")
    except PackageNotFoundError:
        return "unknown"


@ollama_get
async def api_version(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"version": OLLAMA_API_VERSION, "appliance": _appliance_version()})


@ollama_get
async def tags(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"models": await sync_to_async(_tags)()})


def _tags() -> list[dict]:
    models = LLMModel.objects.select_related("base").prefetch_related(
        "pulled_names", "base__pulled_names"
    )
    # One entry per name, as Ollama lists them: a model pulled under two names shows twice.
    return [tag(m, name) for m in models for name in tag_names(m)]


def _running() -> list[dict]:
    """Every loaded model, as `ollama ps` rows: one per model, with the inference workers that
    hold it in an extra field, "workers" (Ollama clients ignore it): a model loaded on two
    boxes is one row naming both."""
    snapshots = get_client().snapshots()
    names = {row["name"] for snap in snapshots for row in snap.get("loaded", [])}
    records = {m.name: m for m in LLMModel.objects.filter(name__in=names)}
    now = datetime.now(UTC)
    rows: dict[str, dict] = {}
    for snap in snapshots:
        for row in snap.get("loaded", []):
            found = rows.get(row["name"])
            if found is None:
                runner = (snap.get("models", {}).get(row["name"]) or {}).get("model") or {}
                found = rows[row["name"]] = {**process(row, records.get(row["name"]), runner, now),
                                             "workers": []}  # fmt: skip
            found["workers"].append(str(snap.get("worker") or ""))
    return list(rows.values())


@ollama_get
async def ps(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"models": await sync_to_async(_running)()})


@ollama_post
async def show_model(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, OllamaModelRequest)
    if not body.target:
        raise ApiError(400, "model is required", param="model")
    # show() reads a derived model's base and names: database reads, off the event loop.
    return JsonResponse(await sync_to_async(show)(await pipeline.resolve_model(body.target)))


# --- delete ------------------------------------------------------------------------------


@api_endpoint(dialect="ollama", methods=("DELETE",), scope=ApiKey.Scope.ADMIN)
async def delete_model(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, OllamaModelRequest)
    if not body.target:
        raise ApiError(400, "model is required", param="model")
    model = await pipeline.resolve_model(body.target)
    if await sync_to_async(forget_name)(model, body.target):
        # One name of several (pulled as llama3.2 and llama3.2:3b): the model stays, as in Ollama.
        log.info("name %s of %s deleted (through the API, key %s)", body.target, model.name,
                 request.api_key.name)  # fmt: skip
        return JsonResponse({"status": "success",
                             "message": f"{body.target} deleted; {model.name} keeps its other "
                             "names"})  # fmt: skip
    try:
        # The models page's delete: unload if idle, then unregister (the file goes when it
        # lives in the models directory; a packaged model is hidden). A derived model goes
        # alone, its base untouched; a base that derived models use is refused.
        outcome = await operations.delete(model)
    except operations.OperationRefused as exc:
        raise ApiError(409, str(exc), code="model_in_use") from None
    log.info("%s (through the API, key %s)", outcome, request.api_key.name)
    return JsonResponse({"status": "success", "message": outcome})


# --- load / unload (an empty conversation) -----------------------------------------------


async def _load_or_unload(request, model: LLMModel, body: OllamaGenerationBase, shape: dict):
    # Loading (which may evict another app's model), unloading and pinning are management, not
    # chat: a chat key gets a 403 here, in Ollama's error shape.
    action = "unloading a model" if body.keep_alive == 0 else "loading a model"
    require_scope(request.api_key, ApiKey.Scope.MANAGE, f"{action} with an empty prompt")
    num_ctx = body.options.num_ctx if body.options else None
    spec = spec_for(model, min_ctx=context_asked(model, num_ctx))
    if body.keep_alive is not None:
        spec = dataclasses.replace(spec, keep_alive=body.keep_alive)
    try:
        if body.keep_alive == 0:
            await get_client().unload(spec.name)  # a derived model's engine is its base's
        else:
            await get_client().load(spec)
    except Exception as exc:  # noqa: BLE001 - a refused load or unload is an error status
        raise from_refusal(load_refusal(exc)) from None
    reason = "unload" if body.keep_alive == 0 else "load"
    line = {"model": body.model, "created_at": now_iso(), **shape, "done": True,
            "done_reason": reason}  # fmt: skip
    return _single(line, body.stream)


def _single(line: dict, stream: bool) -> HttpResponse:
    if stream:
        return HttpResponse(ndjson(line), content_type="application/x-ndjson")
    return JsonResponse(line)


# --- chat and generate -------------------------------------------------------------------


def _piece(key: str, text: str, calls: list | None = None, thinking: str = "") -> dict:
    """The answer field of one line: chat has `message`, generate has `response`; the thinking
    goes beside the text, as `message.thinking` or `thinking`, when there is some."""
    extra = {"thinking": thinking} if thinking else {}
    if key == "response":
        return {"response": text, **extra}
    message = {"role": "assistant", "content": text, **extra}
    if calls:
        message["tool_calls"] = [call.ollama() for call in calls]
    return {"message": message}


class LinesWriter:
    """An answer as Ollama's lines, under `key`: "message" (chat) or "response" (generate)."""

    content_type = "application/x-ndjson"

    def __init__(self, answer: Answer, key: str):
        self.answer = answer
        self.key = key

    def _logprobs(self) -> dict:
        """The line's `logprobs`: those of the tokens whose text is out by now, when asked."""
        entries = self.answer.take_logprobs()
        return {"logprobs": ollama_entries(entries)} if entries else {}

    def opening(self) -> list[bytes]:
        return []

    def piece(self, piece: Piece) -> list[bytes]:
        if not piece:
            return []
        return [ndjson({"model": self.answer.name, "created_at": now_iso(),
                        **_piece(self.key, piece.content, thinking=piece.thinking),
                        "done": False, **self._logprobs()})]  # fmt: skip

    def ending(self, end: Ending) -> list[bytes]:
        return [ndjson(self.final(end))]

    def failure(self, error: ApiError) -> list[bytes]:
        return [ndjson(error.body("ollama"))]

    def final(self, end: Ending) -> dict:
        """The last line: the rest of the answer, its calls, and how it went."""
        return {"model": self.answer.name, "created_at": now_iso(),
                **_piece(self.key, end.text.content, end.calls, end.text.thinking),
                "done": True, "done_reason": end.finish_reason,
                **ollama_durations(end.figures), "timings": timings(end.figures),
                **self._logprobs()}  # fmt: skip


async def _generate(request: HttpRequest, body: OllamaGenerationBase, key: str) -> HttpResponse:
    model = await pipeline.resolve_model(body.model)
    if body.loads_only:
        return await _load_or_unload(request, model, body, _piece(key, ""))
    answer = await pipeline.start(request, body.ask(), source="ollama", model=model)
    return await pipeline.respond(answer, LinesWriter(answer, key), streamed=body.stream)


# Chat and generate take images (dashboard.api.images): a larger body than the other endpoints.
ollama_images = api_endpoint(dialect="ollama", methods=("POST",),
                             max_body=settings.MAX_IMAGE_BODY_BYTES)  # fmt: skip


@ollama_images
async def chat(request: HttpRequest) -> HttpResponse:
    return await _generate(request, parse_body(request, OllamaChatRequest), "message")


@ollama_images
async def generate(request: HttpRequest) -> HttpResponse:
    return await _generate(request, parse_body(request, OllamaGenerateRequest), "response")
