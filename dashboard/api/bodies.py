"""What the LAN API's request bodies share: strict pydantic models, bounded field types, and
the parsing that turns a body into a model or a 400 naming the field.

Nothing reaches the engine unchecked: a negative, absurd or mistyped value is a 400 that names
the field. Models are strict (no "0.7" for a number, no true for 1) and ignore unknown fields,
as OpenAI and Ollama clients add fields over time. What the engine cannot honestly do (images,
several choices, a JSON schema keyword its grammar cannot enforce) is refused rather than
silently ignored. The bodies themselves are each dialect's schemas (openai/, responses/,
anthropic/, ollama/); what they mean in common is dashboard.api.rules.
"""

import json
from typing import Annotated, Any, Literal, TypeVar

from django.http import HttpRequest, RawPostDataException
from django.http.request import RequestDataTooBig
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
)

from dashboard.api.errors import ApiError
from inference.engine.params import (
    MAX_GRAMMAR_CHARS,
    MAX_STOP_LENGTH,
    MAX_STOP_STRINGS,
    MAX_TOKENS_LIMIT,
    MAX_TOP_LOGPROBS,
    SEED_LIMIT,
)
from inference.text.structured import check_schema

MAX_MESSAGES = 500
MAX_CONTENT_CHARS = 256_000  # one message
MAX_PROMPT_CHARS = 1_000_000  # a whole conversation: more than any context we load holds
MAX_TOOLS = 64
MAX_NAME_CHARS = 200


class Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


def refuse_if(test, message: str):
    """A validator that rejects values for which `test(value)` holds, with `message`."""

    def check(value):
        if value is not None and test(value):
            raise ValueError(message)
        return value

    return AfterValidator(check)


def one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def text_parts(value: Any) -> Any:
    """OpenAI content parts → one string; only text parts exist for a text-only model."""
    if not isinstance(value, list):
        return value
    texts = []
    for part in value:
        if not isinstance(part, dict) or part.get("type") != "text":
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"content parts of type {kind!r} are not supported: text only")
        if not isinstance(part.get("text"), str):
            raise ValueError("a text content part needs a string 'text'")
        texts.append(part["text"])
    return "\n".join(texts)


ModelName = Annotated[str, Field(max_length=MAX_NAME_CHARS)]
Content = Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]
ShortText = Annotated[str, Field(max_length=256)]
StopText = Annotated[str, Field(min_length=1, max_length=MAX_STOP_LENGTH)]
StopList = Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS)]
Stop = Annotated[
    StopList | None, BeforeValidator(one_or_many, json_schema_input_type=StopText | StopList | None)
]
MaxTokens = Annotated[int, Field(ge=1, le=MAX_TOKENS_LIMIT)]
Seed = Annotated[int, Field(ge=0, le=SEED_LIMIT)]
Penalty = Annotated[float, Field(ge=-2.0, le=2.0)]
Unit = Annotated[float, Field(ge=0.0, le=1.0)]
TopK = Annotated[int, Field(ge=0, le=100_000)]
RepeatPenalty = Annotated[float, Field(ge=0.0, le=5.0)]
RepeatLastN = Annotated[int, Field(ge=-1, le=1 << 16)]
PromptText = Annotated[str, Field(max_length=MAX_PROMPT_CHARS)]


def _needs_logprobs(top: int | None, info: ValidationInfo) -> int | None:
    if top and not info.data.get("logprobs"):
        raise ValueError("top_logprobs needs logprobs: true")
    return top


# How many likeliest tokens to list beside each sampled one (OpenAI's and Ollama's top_logprobs,
# declared after the `logprobs` switch it needs).
TopLogprobs = Annotated[
    Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None, AfterValidator(_needs_logprobs)
]

# Structured output (inference.text.structured): a JSON schema the grammar can enforce, checked
# (and converted once) while the body is validated; a raw GBNF grammar as llama-server takes it,
# whose parse llama.cpp checks at submit.
JsonSchema = Annotated[dict[str, Any], AfterValidator(check_schema)]
GrammarText = Annotated[str, Field(min_length=1, max_length=MAX_GRAMMAR_CHARS)]


class TextPart(Strict):
    type: Literal["text"]
    text: Content


ToolName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]
ToolDescription = Annotated[str, Field(max_length=8192)]


class FunctionSpec(Strict):
    name: ToolName
    description: ToolDescription | None = None
    parameters: dict[str, Any] | None = None


class Tool(Strict):
    type: Literal["function"] = "function"
    function: FunctionSpec


Tools = Annotated[list[Tool], Field(max_length=MAX_TOOLS)]


def check_prompt_chars(total: int) -> None:
    """A conversation longer than any context we load holds is refused before it is rendered."""
    if total > MAX_PROMPT_CHARS:
        raise ValueError(f"the conversation is {total} characters, over {MAX_PROMPT_CHARS}")


def total_chars(messages: list) -> list:
    check_prompt_chars(sum(len(m.content or "") for m in messages))
    return messages


M = TypeVar("M", bound=BaseModel)
_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none", "literal"}


def _param(loc: tuple) -> str:
    """The field path of a validation error, without pydantic's union member tags."""
    parts = []
    for item in loc:
        if isinstance(item, int):
            parts.append(str(item))
        elif item.isidentifier() and item.islower() and item not in _TYPE_TAGS:
            parts.append(item)
    return ".".join(parts)


def validation_error(exc: ValidationError) -> ApiError:
    error = exc.errors(include_url=False)[0]
    param = _param(error["loc"])
    cause = (error.get("ctx") or {}).get("error")
    message = str(cause) if error["type"] == "value_error" and cause else error["msg"]
    return ApiError(400, f"{param}: {message}" if param else message, param=param or None,
                    code="invalid_value")  # fmt: skip


def parse_body(request: HttpRequest, model: type[M]) -> M:
    """The request's JSON body validated as `model`; ApiError 400 or 413 otherwise."""
    try:
        body = request.body
    except (RequestDataTooBig, RawPostDataException):
        raise ApiError(413, "the request body is too large", code="request_too_large") from None
    if not body.strip():
        raise ApiError(400, "the request needs a JSON body", code="invalid_json")
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        raise ApiError(400, "the request body is not valid JSON", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    try:
        # JSON mode: strictness as JSON has it (an integer is a valid number).
        return model.model_validate_json(body)
    except ValidationError as exc:
        raise validation_error(exc) from None
