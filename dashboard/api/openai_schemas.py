"""OpenAI request bodies: /v1/chat/completions and /v1/completions."""

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dashboard.api.schemas import (
    MAX_CONTENT_CHARS,
    MAX_MESSAGES,
    MAX_TOOLS,
    Content,
    GrammarText,
    JsonSchema,
    MaxTokens,
    ModelName,
    Penalty,
    PromptText,
    RepeatPenalty,
    Seed,
    ShortText,
    Stop,
    Strict,
    TextPart,
    Tools,
    TopK,
    TopLogprobs,
    Unit,
    one_grammar,
    refuse_if,
    text_parts,
    total_chars,
)
from inference.engine.generation import Priority
from inference.engine.params import MAX_TOP_LOGPROBS
from inference.text.structured import json_object_grammar, schema_grammar
from inference.text.thinking import Think


class OpenAIFunctionCall(Strict):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    arguments: Annotated[str, Field(max_length=MAX_CONTENT_CHARS)] = "{}"


class OpenAIToolCall(Strict):
    id: ShortText = ""
    type: Literal["function"] = "function"
    function: OpenAIFunctionCall


class OpenAIMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Annotated[
        Content | None,
        BeforeValidator(text_parts, json_schema_input_type=Content | list[TextPart] | None),
    ] = None
    name: Annotated[str, Field(max_length=64)] | None = None
    tool_calls: Annotated[list[OpenAIToolCall], Field(max_length=MAX_TOOLS)] | None = None
    tool_call_id: ShortText | None = None
    reasoning_content: Content | None = None  # an earlier answer's thinking (DeepSeek's name)


class StreamOptions(Strict):
    include_usage: bool = False


class JsonSchemaFormat(Strict):
    name: Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_\-]+$")]
    description: Content | None = None
    schema_: Annotated[JsonSchema | None, Field(alias="schema")] = None  # none: any object
    # Accepted either way: the grammar always holds the output to the schema, and a schema
    # keyword it cannot enforce is a 400 with or without strict.
    strict: bool | None = None


class ResponseFormat(Strict):
    """text; json_object (any JSON object, or llama-server's `schema` beside it); json_schema."""

    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = None
    schema_: Annotated[JsonSchema | None, Field(alias="schema")] = None  # llama-server's

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("a json_schema response_format needs json_schema: {name, schema}")
        return self

    def grammar(self) -> str | None:
        if self.type == "text":
            return None
        schema = self.json_schema.schema_ if self.json_schema else self.schema_
        return json_object_grammar() if schema is None else schema_grammar(schema)


class OpenAISampling(Strict):
    """What /v1/chat/completions and /v1/completions share."""

    model: ModelName = ""
    max_tokens: MaxTokens | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Unit | None = None
    n: Annotated[int, Field(ge=1, le=1, description="only 1: one choice per request")] = 1
    seed: Seed | None = None
    stop: Stop = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    # llama-server's extensions, which its users send through the openai client's extra_body.
    top_k: TopK | None = None
    min_p: Unit | None = None
    repeat_penalty: RepeatPenalty | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: ShortText | None = None
    logit_bias: Annotated[
        dict[str, float] | None, refuse_if(bool, "logit_bias is not supported by this engine")
    ] = None
    grammar: GrammarText | None = None  # llama-server's: a GBNF grammar for the output
    # OpenAI's processing tiers: "flex" (slower, cheaper there) asks for background priority
    # here; the others are the key's own. A request can lower its priority, never raise it.
    service_tier: Literal["auto", "default", "flex", "priority"] | None = None

    @property
    def priority(self) -> Priority:
        return "background" if self.service_tier == "flex" else "interactive"

    def sampling(self) -> dict:
        fields = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty",
                  "top_k", "min_p", "repeat_penalty")  # fmt: skip
        params = {name: getattr(self, name) for name in fields if getattr(self, name) is not None}
        if self.max_tokens is not None:
            params["max_tokens"] = self.max_tokens
        if self.stop:
            params["stop"] = tuple(self.stop)
        if self.grammar is not None:
            params["grammar"] = self.grammar
        return params

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(OpenAISampling):
    messages: Annotated[
        list[OpenAIMessage],
        Field(min_length=1, max_length=MAX_MESSAGES),
        AfterValidator(total_chars),
    ]
    max_completion_tokens: MaxTokens | None = None
    tools: Tools | None = None
    tool_choice: Annotated[
        Literal["none", "auto", "required"] | dict[str, Any] | None,
        refuse_if(lambda v: v == "required" or isinstance(v, dict),
                  "tool_choice can be 'auto' or 'none': this engine cannot force a tool call"),
    ] = None  # fmt: skip
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs = None
    # Thinking: "none" and "minimal" turn a thinking mode off (the least a switch can do); the
    # levels turn it on and reach templates that read them (gpt-oss).
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None

    @property
    def think(self) -> Think:
        """The switch the template gets: off when the output is constrained by a grammar, which
        would hold the thinking to it too."""
        if self.reasoning_effort in ("none", "minimal") or self._constrained:
            return False
        return self.reasoning_effort

    @property
    def _constrained(self) -> bool:
        format_ = self.response_format
        return self.grammar is not None or (format_ is not None and format_.type != "text")

    @field_validator("reasoning_effort")
    @classmethod
    def _think_without_grammar(cls, value: str | None, info: ValidationInfo) -> str | None:
        format_ = info.data.get("response_format")
        constrained = info.data.get("grammar") is not None or (
            format_ is not None and format_.type != "text"
        )
        if value not in (None, "none", "minimal") and constrained:
            raise ValueError("reasoning_effort cannot be combined with a json response_format "
                             "or grammar: the grammar would hold the thinking to it too; send "
                             "reasoning_effort: none")  # fmt: skip
        return value

    @field_validator("response_format")
    @classmethod
    def _one_grammar(cls, value: ResponseFormat | None, info: ValidationInfo):
        constraining = value if value is not None and value.type != "text" else None
        one_grammar(info.data.get("grammar"), constraining, "response_format")
        return value

    def sampling(self) -> dict:
        params = super().sampling()
        if self.logprobs:
            params["logprobs"] = self.top_logprobs or 0  # the sampled token's alone: 0
        if self.max_completion_tokens is not None:
            params["max_tokens"] = self.max_completion_tokens
        grammar = self.response_format.grammar() if self.response_format else None
        if grammar is not None:
            params["grammar"] = grammar
        return params

    @property
    def active_tools(self) -> list[dict] | None:
        if not self.tools or self.tool_choice == "none":
            return None
        return [tool.model_dump(exclude_none=True) for tool in self.tools]


def _one_prompt(value: Any) -> Any:
    if isinstance(value, list):
        if len(value) != 1 or not isinstance(value[0], str):
            raise ValueError("one text prompt per request: batches and token arrays are "
                             "not supported")  # fmt: skip
        return value[0]
    return value


class CompletionRequest(OpenAISampling):
    prompt: Annotated[
        PromptText,
        BeforeValidator(_one_prompt, json_schema_input_type=PromptText | list[PromptText]),
    ]
    echo: Annotated[bool, refuse_if(bool, "echo is not supported by this engine")] = False
    suffix: Annotated[
        str | None, refuse_if(bool, "suffix (fill-in-the-middle) is not supported")
    ] = None
    best_of: Annotated[int, Field(ge=1, le=1)] | None = None
    # The legacy form: the sampled token's log-probability and this many likeliest beside it.
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    def sampling(self) -> dict:
        params = super().sampling()
        if self.logprobs is not None:
            params["logprobs"] = self.logprobs
        return params
