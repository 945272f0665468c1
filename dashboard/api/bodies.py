"""What the LAN API's request bodies share: strict pydantic models, bounded field types, and
the parsing that turns a body into a model or a 400 naming the field.

Nothing reaches the engine unchecked: a negative, absurd or mistyped value is a 400 that names
the field. Models are strict (no "0.7" for a number, no true for 1) and ignore unknown fields,
as OpenAI and Ollama clients add fields over time. What the engine cannot honestly do (several
choices, a JSON schema keyword its grammar cannot enforce, an image URL to fetch) is refused
rather than silently ignored. Images are read with the body (dashboard.api.images). The bodies
themselves are each dialect's schemas (openai/, responses/, anthropic/, ollama/); what they
mean in common is dashboard.api.rules.
"""

import json
from typing import Annotated, Any, Literal, TypeVar

from django.conf import settings
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

from dashboard.api.auth import policy_of
from dashboard.api.errors import ApiError
from dashboard.api.images import Parts, image_from_url, text_chars
from inference.engine.params import (
    LOGIT_BIAS_LIMIT,
    MAX_GRAMMAR_CHARS,
    MAX_LOGIT_BIAS,
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


def content_parts(value: Any) -> Any:
    """OpenAI chat content parts → one string when they are all text (joined by newlines), else
    the parts: text, and each `image_url` part's image (dashboard.api.images) where it was."""
    if not isinstance(value, list):
        return value
    parts: list = []
    for index, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise ValueError(f"part {index}: a text content part needs a string 'text'")
            parts.append(part["text"])
        elif kind == "image_url":
            url = part.get("image_url")
            url = url.get("url") if isinstance(url, dict) else url
            try:
                parts.append(image_from_url(url))
            except ValueError as exc:
                raise ValueError(f"part {index} (image_url): {exc}") from None
        else:
            raise ValueError(f"content parts of type {kind!r} are not supported: text and "
                             "image_url only")  # fmt: skip
    if all(isinstance(part, str) for part in parts):
        return "\n".join(parts)
    return parts


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


def _token_ids(value: dict[str, float]) -> dict[str, float]:
    for key in value:
        if not key.isdecimal() or int(key) >= 1 << 31:
            raise ValueError(f"the keys are token ids (as strings of digits), got {key!r}")
    return value


# OpenAI's logit_bias: a token id (a JSON key, so a string) → a bias from -100 (a ban) to 100;
# whether the id is in the model's vocabulary is the runner's check.
LogitBias = Annotated[
    dict[str, Annotated[float, Field(ge=-LOGIT_BIAS_LIMIT, le=LOGIT_BIAS_LIMIT)]],
    Field(max_length=MAX_LOGIT_BIAS),
    AfterValidator(_token_ids),
]


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


class ImageUrl(Strict):
    url: Annotated[str, Field(description="a base64 data: URL (data:image/jpeg;base64,...): "
                              "JPEG, PNG, GIF or BMP; http(s) URLs are not fetched")]  # fmt: skip
    detail: Literal["auto", "low", "high"] | None = None


class ImageUrlPart(Strict):
    """OpenAI chat's image part (what a body may send; validated into an Image)."""

    type: Literal["image_url"]
    image_url: ImageUrl


# A chat message's content: text, or parts (text and images) in the order sent.
ChatContent = Annotated[
    Content | Parts | None,
    BeforeValidator(content_parts,
                    json_schema_input_type=Content | list[TextPart | ImageUrlPart] | None),
]  # fmt: skip


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
    check_prompt_chars(sum(text_chars(m.content) for m in messages))
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


def _too_large() -> ApiError:
    return ApiError(413, "the request body is too large", code="request_too_large")


def read_body(request: HttpRequest) -> bytes:
    """The request's body, up to its view's cap (api_endpoint's max_body: the gate refused a
    larger one before it was read); Django's own cap, DATA_UPLOAD_MAX_MEMORY_SIZE, for the rest."""
    policy = policy_of(request.resolver_match.func) if request.resolver_match else None
    cap = policy.body_cap() if policy else settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    try:
        if cap <= settings.DATA_UPLOAD_MAX_MEMORY_SIZE:
            return request.body
        if int(request.META.get("CONTENT_LENGTH") or 0) > cap:
            raise _too_large()
        body = request.read(cap + 1)
    except (RequestDataTooBig, RawPostDataException):
        raise _too_large() from None
    if len(body) > cap:
        raise _too_large()
    return body


def parse_body(request: HttpRequest, model: type[M]) -> M:
    """The request's JSON body validated as `model`; ApiError 400 or 413 otherwise."""
    body = read_body(request)
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
