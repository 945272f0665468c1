"""llama-server's /tokenize, /detokenize and /apply-template (plus a `model` field).

Tokens come from the model's own tokenizer in its runner process (inference.serving.tokens; the
web process never loads llama.cpp), so a count is what a generation on the same text counts as
its prompt_tokens (dashboard.api.pipeline.tokenize_text, which Anthropic's count_tokens uses
too). /apply-template renders a chat completions body as the answer pipeline would, and needs no
runner.
"""

from typing import Annotated

from django.conf import settings
from django.http import HttpRequest, JsonResponse
from pydantic import Field

from dashboard.api import pipeline
from dashboard.api.auth import api_endpoint
from dashboard.api.bodies import ModelName, PromptText, Strict, parse_body
from dashboard.api.errors import from_event
from dashboard.api.openai.schemas import ChatCompletionRequest
from inference.catalog.specs import spec_for
from inference.engine.tokens import MAX_TOKENS
from inference.serving.client import get_client
from inference.serving.tokens import TokenError

post = api_endpoint(dialect="openai", methods=("POST",))

TokenId = Annotated[int, Field(ge=0, lt=1 << 31)]  # the vocabulary's bound is the runner's


class TokenizeRequest(Strict):
    model: ModelName = ""
    content: PromptText
    add_special: bool = False  # llama-server's default: no BOS unless asked
    parse_special: bool = True  # false: "<|endoftext|>" in the text is plain characters
    with_pieces: bool = False


class DetokenizeRequest(Strict):
    model: ModelName = ""
    tokens: Annotated[list[TokenId], Field(max_length=MAX_TOKENS)]


def piece_json(piece: bytes) -> str | list[int]:
    """llama-server's piece: the text where the bytes are valid UTF-8, else the bytes."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


@post
async def tokenize(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, TokenizeRequest)
    model = await pipeline.resolve_model(body.model)
    result = await pipeline.tokenize_text(model, body.content, add_special=body.add_special,
                                          parse_special=body.parse_special,
                                          with_pieces=body.with_pieces)  # fmt: skip
    if result.pieces is None:
        return JsonResponse({"model": model.name, "tokens": list(result.tokens)})
    tokens = [{"id": token, "piece": piece_json(piece)}
              for token, piece in zip(result.tokens, result.pieces, strict=True)]  # fmt: skip
    return JsonResponse({"model": model.name, "tokens": tokens})


@post
async def detokenize(request: HttpRequest) -> JsonResponse:
    body = parse_body(request, DetokenizeRequest)
    model = await pipeline.resolve_model(body.model)
    try:
        result = await get_client().detokenize(spec_for(model), body.tokens)
    except TokenError as exc:
        raise from_event(exc.event) from None
    return JsonResponse({"model": model.name, "content": result.text})


# A chat completions body, images and all (dashboard.api.images): the same cap as chat's, so the
# body that is answered can be shown.
@api_endpoint(dialect="openai", methods=("POST",), max_body=settings.MAX_IMAGE_BODY_BYTES)
async def apply_template(request: HttpRequest) -> JsonResponse:
    """A chat completions body's messages (and tools, reasoning_effort) rendered as the prompt
    /v1/chat/completions would send."""
    ask = parse_body(request, ChatCompletionRequest).ask()
    model = await pipeline.resolve_model(ask.model)
    prompt = await pipeline.render(model, ask)
    return JsonResponse({"model": model.name, "prompt": prompt.text})
