"""Embedding request bodies: Ollama's /api/embed and /api/embeddings, OpenAI's /v1/embeddings.

Bounded here, before anything reaches a runner: at most MAX_INPUTS inputs, each text at most
MAX_CONTENT_CHARS characters and all of them MAX_PROMPT_CHARS, each token array at most
MAX_TOKENS_PER_ARRAY non-negative ids. Whether an id is in the model's vocabulary, and how many
tokens a text is, only the runner knows: it checks those (inference.engine.embedding).
"""

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from dashboard.api.ollama_schemas import KeepAlive, OllamaOptions
from dashboard.api.schemas import MAX_CONTENT_CHARS, MAX_PROMPT_CHARS, ModelName, Strict
from inference.engine.embedding import MAX_INPUTS, MAX_TOTAL_TOKENS

MAX_TOKENS_PER_ARRAY = 1 << 16
MAX_DIMENSIONS = 1 << 16

EmbedText = Annotated[str, Field(max_length=MAX_CONTENT_CHARS)]
TokenId = Annotated[int, Field(ge=0, le=(1 << 31) - 1)]
TokenArray = Annotated[list[TokenId], Field(min_length=1, max_length=MAX_TOKENS_PER_ARRAY)]
Dimensions = Annotated[int, Field(ge=1, le=MAX_DIMENSIONS)]


def _total_chars(texts: list[str]) -> list[str]:
    total = sum(len(t) for t in texts)
    if total > MAX_PROMPT_CHARS:
        raise ValueError(f"the inputs are {total} characters together, over {MAX_PROMPT_CHARS}")
    return texts


def _total_tokens(arrays: list[list[int]]) -> list[list[int]]:
    total = sum(len(a) for a in arrays)
    if total > MAX_TOTAL_TOKENS:
        raise ValueError(f"the inputs are {total} tokens together, over {MAX_TOTAL_TOKENS}")
    return arrays


TextList = Annotated[list[EmbedText], Field(max_length=MAX_INPUTS), AfterValidator(_total_chars)]
TokenArrays = Annotated[
    list[TokenArray], Field(min_length=1, max_length=MAX_INPUTS), AfterValidator(_total_tokens)
]


def _one_or_many(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


class OllamaEmbedRequest(Strict):
    """/api/embed: `input` a string or a list of strings; an empty input loads the model."""

    model: Annotated[str, Field(min_length=1, max_length=200)]
    input: Annotated[
        TextList, BeforeValidator(_one_or_many, json_schema_input_type=EmbedText | TextList)
    ] = Field(default_factory=list)
    truncate: bool = True  # Ollama's default: cut an input to the context instead of a 400
    options: OllamaOptions | None = None  # accepted for compatibility; sampling has no effect
    keep_alive: KeepAlive = None
    dimensions: Dimensions | None = None

    @property
    def inputs(self) -> list[str]:
        # Ollama drops a lone empty string (that request only loads the model).
        return [] if self.input == [""] else list(self.input)


class OllamaEmbeddingsRequest(Strict):
    """/api/embeddings, Ollama's older endpoint: one `prompt`; its vector is not normalised."""

    model: Annotated[str, Field(min_length=1, max_length=200)]
    prompt: EmbedText = ""
    options: OllamaOptions | None = None
    keep_alive: KeepAlive = None


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _openai_inputs(value: Any) -> list:
    """OpenAI's four input shapes → a list of inputs, each a non-empty string or token array.
    Checked by hand rather than as a union, so that a 400 says what is wrong with which input."""
    if isinstance(value, str) or (isinstance(value, list) and value and all(map(_is_token, value))):
        items = [value]
    elif isinstance(value, list):
        items = value
    else:
        raise ValueError("must be a string, a list of strings, a token array or a list of them")
    if not items:
        raise ValueError("at least one input is needed")
    if len(items) > MAX_INPUTS:
        raise ValueError(f"at most {MAX_INPUTS} inputs per request, got {len(items)}")
    chars = tokens = 0
    for index, item in enumerate(items):
        where = f"input {index}" if len(items) > 1 else "the input"
        if isinstance(item, str):
            if not item:
                raise ValueError(f"{where} is an empty string")
            if len(item) > MAX_CONTENT_CHARS:
                raise ValueError(f"{where} is over {MAX_CONTENT_CHARS} characters")
            chars += len(item)
        elif isinstance(item, list):
            if not item or len(item) > MAX_TOKENS_PER_ARRAY:
                raise ValueError(f"{where} must hold 1 to {MAX_TOKENS_PER_ARRAY} token ids")
            if not all(_is_token(t) and 0 <= t < 1 << 31 for t in item):
                raise ValueError(f"{where}: token ids must be non-negative integers")
            tokens += len(item)
        else:
            raise ValueError(f"{where} must be a string or a token array")
    if chars > MAX_PROMPT_CHARS:
        raise ValueError(f"the inputs are {chars} characters together, over {MAX_PROMPT_CHARS}")
    if tokens > MAX_TOTAL_TOKENS:
        raise ValueError(f"the inputs are {tokens} tokens together, over {MAX_TOTAL_TOKENS}")
    return items


class OpenAIEmbeddingRequest(Strict):
    """/v1/embeddings: a string, a list of strings, a token array or a list of token arrays."""

    model: ModelName = ""
    input: Annotated[
        list[EmbedText | list[int]],
        BeforeValidator(
            _openai_inputs, json_schema_input_type=EmbedText | TextList | TokenArray | TokenArrays
        ),
    ]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Dimensions | None = None
    user: Annotated[str, Field(max_length=256)] | None = None

    @property
    def inputs(self) -> list[str | list[int]]:
        return list(self.input)
