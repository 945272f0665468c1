"""Ollama-compatible endpoints: /api/tags, /api/ps, /api/show, /api/chat, /api/generate,
/api/version and DELETE /api/delete (a name, a derived model, or a model with its file; the
making of models is create_views').

Answers stream as NDJSON by default (`stream: false` gives one object); the last line has
`done: true`, the done reason and Ollama's timing fields in nanoseconds. An empty conversation
or prompt loads the model (or, with keep_alive 0, unloads it), as Ollama does; that needs a key
with the manage scope. A chat key's keep_alive on a generation can shorten the model's own
keep-alive but never lengthen or pin it (see `_granted_keep_alive`).
"""

import dataclasses
import logging
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse, JsonResponse

from dashboard.api.answers import AnswerParser
from dashboard.api.auth import api_endpoint, app_id, caller_fields, require_scope
from dashboard.api.errors import ApiError, from_event, from_refusal
from dashboard.api.logprobs import ollama_entries
from dashboard.api.ollama_schemas import (
    OllamaChatRequest,
    OllamaGenerateRequest,
    OllamaGenerationBase,
    OllamaModelRequest,
)
from dashboard.api.ollama_shapes import now_iso, process, show, tag, tag_names
from dashboard.api.prompts import ChatPrompt, chat_prompt, raw_prompt
from dashboard.api.runs import Run, api_request, resolve_model
from dashboard.api.schemas import parse_body
from dashboard.api.streaming import ndjson, stream_response
from dashboard.api.timings import ollama_durations
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
    return JsonResponse(await sync_to_async(show)(await resolve_model(body.target)))


# --- delete ------------------------------------------------------------------------------


@api_endpoint(dialect="ollama", methods=("DELETE",), scope=ApiKey.Scope.ADMIN)
async def delete_model(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, OllamaModelRequest)
    if not body.target:
        raise ApiError(400, "model is required", param="model")
    model = await resolve_model(body.target)
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
    spec = spec_for(model, min_ctx=_num_ctx(model, body))
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


def _client_name(request: HttpRequest) -> str:
    return request.api_key.name


@ollama_post
async def chat(request: HttpRequest) -> HttpResponse:
    body = parse_body(request, OllamaChatRequest)
    model = await resolve_model(body.model)
    if not body.messages:
        return await _load_or_unload(
            request, model, body, {"message": {"role": "assistant", "content": ""}}
        )
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    prompt = await chat_prompt(model, messages, body.active_tools, think=body.think_switch)
    return await _generate(request, model, body, prompt, "message")


@ollama_post
async def generate(request: HttpRequest) -> HttpResponse:
    body = parse_body(request, OllamaGenerateRequest)
    model = await resolve_model(body.model)
    if not body.prompt:
        return await _load_or_unload(request, model, body, {"response": ""})
    if body.raw:
        prompt = raw_prompt(model, body.prompt, body.think_switch)
    else:
        messages = [{"role": "user", "content": body.prompt}]
        if body.system:
            messages.insert(0, {"role": "system", "content": body.system})
        prompt = await chat_prompt(model, messages, None, think=body.think_switch)
    return await _generate(request, model, body, prompt, "response")


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


def _num_ctx(model: LLMModel, body: OllamaGenerationBase) -> int:
    """The context per sequence the request asks (options.num_ctx, clamped at the model's
    training context; 0: none). More than the loaded model holds reloads it when it fits (a 507
    with the numbers when not); less just runs on what is loaded. Any scope may ask: Home
    Assistant sends num_ctx on a chat key."""
    return context_asked(model, body.options.num_ctx if body.options else None)


def _granted_keep_alive(api_key: ApiKey, model: LLMModel, asked: float | None) -> float | None:
    """The keep_alive a generation runs with. A manage or admin key's is used as sent. A chat
    key's is clamped to the model's own keep-alive (its page, else DEFAULT_KEEP_ALIVE): shorter
    (0 included) is kept, as it only frees memory sooner, which asking for another model can do
    anyway; longer or negative (pin for ever) becomes the model's own, so that one app cannot
    hold the memory every app shares. Clamped, not refused: Home Assistant's Ollama integration
    sends keep_alive -1 with every request, and its calls must keep working on a chat key."""
    if asked is None or api_key.allows(ApiKey.Scope.MANAGE):
        return asked
    own = spec_for(model).keep_alive
    if own < 0 or 0 <= asked <= own:
        return asked
    log.debug("keep_alive %s from chat key %s clamped to %s's own %s s",
              asked, api_key.name, model.name, own)  # fmt: skip
    return None  # the model's own keep-alive


async def _generate(request, model: LLMModel, body, prompt: ChatPrompt, key: str):
    keep_alive = _granted_keep_alive(request.api_key, model, body.keep_alive)
    asked = api_request(model, prompt.prompt, prompt.constrain(body.sampling()),
                        keep_alive=keep_alive, **caller_fields(request))  # fmt: skip
    run = Run(model, asked, source="ollama", client_name=_client_name(request),
              app=app_id(request), min_ctx=_num_ctx(model, body))  # fmt: skip
    await run.start()
    parser = prompt.answer_parser()
    if body.stream:
        return stream_response(_lines(run, body.model, key, parser), "application/x-ndjson")
    async for _ in run.events():
        pass
    final = run.final or {}
    if final.get("type") != "done":
        raise from_event(final)
    piece, calls = parser.whole(final["text"])
    return JsonResponse(_last_line(run, body.model, key, piece.content, calls, final,
                                   piece.thinking))  # fmt: skip


def _logprobs(run: Run) -> dict:
    """The line's `logprobs`: those of the tokens whose text is out by now, when asked."""
    entries = run.take_logprobs()
    return {"logprobs": ollama_entries(entries)} if entries else {}


def _last_line(
    run: Run, name: str, key: str, text: str, calls: list, done: dict, thinking: str = ""
) -> dict:
    return {"model": name, "created_at": now_iso(), **_piece(key, text, calls, thinking),
            "done": True, "done_reason": done["finish_reason"],
            **ollama_durations(done["figures"]), **_logprobs(run)}  # fmt: skip


async def _lines(run: Run, name: str, key: str, parser: AnswerParser) -> AsyncIterator[bytes]:
    try:
        async for event in run.events():
            if event["type"] == "token":
                piece = parser.feed(event["text"])
                if piece:
                    yield ndjson({"model": name, "created_at": now_iso(),
                                  **_piece(key, piece.content, thinking=piece.thinking),
                                  "done": False, **_logprobs(run)})  # fmt: skip
                    run.first_output.sent()  # on the socket now: the TTFT (dashboard.wire)
            elif event["type"] == "done":
                rest, calls = parser.finish()
                yield ndjson(_last_line(run, name, key, rest.content, calls, event,
                                        rest.thinking))  # fmt: skip
                if rest or calls:
                    run.first_output.sent()
            elif event["type"] == "error":
                yield ndjson(from_event(event).body("ollama"))
                return
    finally:
        await run.close()  # a client that left mid-stream cancels its generation here
