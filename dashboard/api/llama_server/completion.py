"""llama-server's /completion: a prompt sent as is (text, token ids, or both mixed) through the
answer pipeline (dashboard.api.pipeline), with llama-server's sampling and stopping fields
(dashboard.api.llama_server.sampling) and its answer shapes (dashboard.api.llama_server.answer),
which /infill shares.

A text prompt is tokenized as llama-server does: the BOS token added where the vocabulary adds
one, special tokens written in the text parsed. In a list, token ids go as they are and strings are
tokenized in place, the BOS token only before a first string (llama-server's tokenize_mixed).
"""

from typing import Annotated, Any

from django.http import HttpRequest
from pydantic import BeforeValidator

from dashboard.api import pipeline
from dashboard.api.auth import api_endpoint
from dashboard.api.bodies import PromptText, parse_body
from dashboard.api.errors import ApiError, from_event
from dashboard.api.llama_server.answer import Reading
from dashboard.api.llama_server.sampling import LlamaSampling, TokenId
from dashboard.api.pipeline import Ask
from dashboard.api.templating import ChatPrompt
from inference.catalog.specs import spec_for
from inference.engine.tokens import MAX_TOKENS
from inference.models import LLMModel
from inference.serving.client import get_client
from inference.serving.tokens import TokenError
from inference.text.prompting import Prompt


def _one_prompt(value: Any) -> Any:
    """llama-server's prompt forms that are one prompt: text, a list of token ids and strings
    (with at least one id), or a list of one string. A list of several strings is several
    prompts, a batch, which it answers with an array: refused here."""
    if isinstance(value, list):
        if not value:
            raise ValueError("the prompt is empty")
        if len(value) > MAX_TOKENS:
            raise ValueError(f"at most {MAX_TOKENS} items, got {len(value)}")
        numbers = any(isinstance(item, int) and not isinstance(item, bool) for item in value)
        if not numbers and len(value) > 1:
            raise ValueError("one prompt per request: a list of several strings is a batch, "
                             "which is not supported; send them one at a time")  # fmt: skip
        if not numbers:
            return value[0]
    return value


class LlamaCompletionRequest(LlamaSampling):
    """llama-server's /completion body: its prompt, and the shared fields."""

    prompt: Annotated[
        PromptText | list[TokenId | PromptText],
        BeforeValidator(
            _one_prompt, json_schema_input_type=PromptText | list[TokenId | PromptText]
        ),
    ]

    def ask(self) -> Ask:
        return Ask(model=self.model, sampling=self.sampling())


async def prompt_tokens(model: LLMModel, prompt: list) -> tuple[int, ...]:
    """A mixed prompt's token ids: strings tokenized in place (the BOS token only before a first
    string, as llama-server's tokenize_mixed), ids checked against the vocabulary."""
    ids: list[int] = []
    for at, item in enumerate(prompt):
        if isinstance(item, str):
            ids += (await pipeline.tokenize_text(model, item, add_special=at == 0)).tokens
        else:
            ids.append(item)
    if len(ids) > MAX_TOKENS:
        raise ApiError(400, f"prompt: at most {MAX_TOKENS} tokens, got {len(ids)}",
                       param="prompt", code="invalid_value")  # fmt: skip
    try:  # the runner's tokenizer knows the vocabulary's size: an id past it is a 400
        await get_client().detokenize(spec_for(model), ids)
    except TokenError as exc:
        error = from_event(exc.event)
        raise ApiError(error.status, f"prompt: {error.message}", param="prompt",
                       code=error.code) from None  # fmt: skip
    return tuple(ids)


async def rendered(model: LLMModel, body: LlamaCompletionRequest) -> ChatPrompt:
    """The prompt as sent, no template: text tokenized by the runner, or token ids (which the
    request carries as they are: GenerationRequest's prompt is text or ids)."""
    if isinstance(body.prompt, str):
        return ChatPrompt(Prompt(body.prompt, add_special=True), None)
    return ChatPrompt(Prompt(await prompt_tokens(model, body.prompt), add_special=False), None)


@api_endpoint(dialect="openai", methods=("POST",))
async def completion(request: HttpRequest):
    body = parse_body(request, LlamaCompletionRequest)
    ask = body.ask()
    model = await pipeline.resolve_model(ask.model)
    prompt = await rendered(model, body)
    [answer] = await pipeline.launch(request, model, ask, prompt, source="llama-server")
    shown = body.prompt if isinstance(body.prompt, str) else ""
    return await Reading(answer, body, shown).respond()


__all__ = ["completion"]
