"""llama-server's /tokenize, /detokenize and /apply-template (plus a `model` field), and the
token count of a rendered prompt (Anthropic's count_tokens; the chat page counts its own in
dashboard.chat.counting, on a loaded model only).

Tokens come from the model's own tokenizer in its runner process (inference.serving.tokens; the
web process never loads llama.cpp), so a count is what a generation on the same text counts as
its prompt_tokens. /apply-template renders through the one prompt path (chat_prompt) and needs
no runner.
"""

from typing import Annotated

from django.http import HttpRequest, JsonResponse
from pydantic import Field

from dashboard.api.auth import api_endpoint
from dashboard.api.errors import from_event
from dashboard.api.openai_schemas import ChatCompletionRequest
from dashboard.api.prompts import chat_prompt
from dashboard.api.runs import resolve_model
from dashboard.api.schemas import ModelName, PromptText, Strict, parse_body, refuse_if
from inference.catalog.specs import spec_for
from inference.engine.tokens import MAX_TOKENS
from inference.models import LLMModel
from inference.serving.client import get_client
from inference.serving.tokens import TokenError, TokenResult
from inference.text.prompting import Prompt

post = api_endpoint(dialect="openai", methods=("POST",))

TokenId = Annotated[int, Field(ge=0, lt=1 << 31)]  # the vocabulary's bound is the runner's


class TokenizeRequest(Strict):
    model: ModelName = ""
    content: PromptText
    add_special: bool = False  # llama-server's default: no BOS unless asked
    parse_special: Annotated[
        bool, refuse_if(lambda v: v is False, "parse_special: false is not supported: special "
                        "tokens written in the text are always parsed, as in a prompt"),
    ] = True  # fmt: skip
    with_pieces: bool = False


class DetokenizeRequest(Strict):
    model: ModelName = ""
    tokens: Annotated[list[TokenId], Field(max_length=MAX_TOKENS)]


async def tokenize_text(
    model: LLMModel, text: str, *, add_special: bool, with_pieces: bool = False
) -> TokenResult:
    try:
        return await get_client().tokenize(spec_for(model), text, add_special=add_special,
                                           with_pieces=with_pieces)  # fmt: skip
    except TokenError as exc:
        raise from_event(exc.event) from None


async def count_prompt_tokens(model: LLMModel, prompt: Prompt) -> int:
    """The prompt tokens a generation of `prompt` would have (its BOS rule included)."""
    result = await tokenize_text(model, prompt.text, add_special=prompt.add_special)
    return len(result.tokens)


def piece_json(piece: bytes) -> str | list[int]:
    """llama-server's piece: the text where the bytes are valid UTF-8, else the bytes."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


@post
async def tokenize(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, TokenizeRequest)
    model = await resolve_model(body.model)
    result = await tokenize_text(model, body.content, add_special=body.add_special,
                                 with_pieces=body.with_pieces)  # fmt: skip
    if result.pieces is None:
        return JsonResponse({"model": model.name, "tokens": list(result.tokens)})
    tokens = [{"id": token, "piece": piece_json(piece)}
              for token, piece in zip(result.tokens, result.pieces, strict=True)]  # fmt: skip
    return JsonResponse({"model": model.name, "tokens": tokens})


@post
async def detokenize(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, DetokenizeRequest)
    model = await resolve_model(body.model)
    try:
        result = await get_client().detokenize(spec_for(model), body.tokens)
    except TokenError as exc:
        raise from_event(exc.event) from None
    return JsonResponse({"model": model.name, "content": result.text})


@post
async def apply_template(request: HttpRequest) -> JsonResponse:
    """A chat completions body's messages (and tools, reasoning_effort) rendered as the prompt
    /v1/chat/completions would send."""
    body = parse_body(request, ChatCompletionRequest)
    model = await resolve_model(body.model)
    messages = [m.model_dump(exclude_none=True) for m in body.messages]
    prompt = await chat_prompt(model, messages, body.active_tools, think=body.think,
                               think_param="reasoning_effort")  # fmt: skip
    return JsonResponse({"model": model.name, "prompt": prompt.text})
