"""OpenAI request bodies: /v1/chat/completions, /v1/completions and /v1/embeddings, and what a
generation body asks in the answer pipeline's terms (`ask()`: dashboard.api.pipeline.Ask)."""

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dashboard.api import rules
from dashboard.api.bodies import (
    MAX_CONTENT_CHARS,
    MAX_MESSAGES,
    MAX_PROMPT_CHARS,
    MAX_TOOLS,
    ChatContent,
    Content,
    GrammarText,
    JsonSchema,
    LogitBias,
    MaxTokens,
    ModelName,
    Penalty,
    PromptText,
    RepeatPenalty,
    Seed,
    ShortText,
    Stop,
    Strict,
    Tools,
    TopK,
    TopLogprobs,
    Unit,
    refuse_if,
    total_chars,
)
from dashboard.api.embedding import (
    MAX_TOKENS_PER_ARRAY,
    Dimensions,
    EmbedText,
    TextList,
    TokenArray,
    TokenArrays,
)
from dashboard.api.pipeline import MAX_CHOICES, Ask
from inference.engine.embedding import MAX_INPUTS, MAX_TOTAL_TOKENS
from inference.engine.generation import Priority
from inference.engine.params import MAX_TOP_LOGPROBS
from inference.text.infill import InfillText
from inference.text.thinking import Think

# What a body may ask of tool calls: this engine can hold calls to the offered tools, not
# force one (the Responses API's tool_choice too).
ToolChoice = Annotated[
    Literal["none", "auto", "required"] | dict[str, Any] | None,
    refuse_if(lambda v: v == "required" or isinstance(v, dict),
              "tool_choice can be 'auto' or 'none': this engine cannot force a tool call"),
]  # fmt: skip


class OpenAIFunctionCall(Strict):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    arguments: Annotated[str, Field(max_length=MAX_CONTENT_CHARS)] = "{}"


class OpenAIToolCall(Strict):
    id: ShortText = ""
    type: Literal["function"] = "function"
    function: OpenAIFunctionCall


class OpenAIMessage(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: ChatContent = None  # text, or text and image_url parts
    name: Annotated[str, Field(max_length=64)] | None = None
    tool_calls: Annotated[list[OpenAIToolCall], Field(max_length=MAX_TOOLS)] | None = None
    tool_call_id: ShortText | None = None
    reasoning_content: Content | None = None  # an earlier answer's thinking (DeepSeek's name)


class StreamOptions(Strict):
    include_usage: bool = False


class JsonSchemaFormat(rules.SchemaFormat):
    name: rules.FormatName


class ResponseFormat(rules.OutputFormat):
    """text; json_object (any JSON object, or llama-server's `schema` beside it); json_schema."""

    json_schema: JsonSchemaFormat | None = None
    schema_: Annotated[JsonSchema | None, Field(alias="schema")] = None  # llama-server's

    @model_validator(mode="after")
    def _schema_given(self) -> "ResponseFormat":
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError("a json_schema response_format needs json_schema: {name, schema}")
        return self

    def output_schema(self) -> dict[str, Any] | None:
        return self.json_schema.schema_ if self.json_schema else self.schema_


class OpenAISampling(Strict):
    """What /v1/chat/completions and /v1/completions share."""

    model: ModelName = ""
    max_tokens: MaxTokens | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Unit | None = None
    n: Annotated[int, Field(ge=1, le=MAX_CHOICES, description=f"choices to generate, each its "
                            f"own sequence (at most {MAX_CHOICES})")] = 1  # fmt: skip
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
    logit_bias: LogitBias | None = None  # token id → -100 (a ban) to 100 (all but forced)
    grammar: GrammarText | None = None  # llama-server's: a GBNF grammar for the output
    service_tier: rules.ServiceTier | None = None  # "flex": background (dashboard.api.rules)

    @property
    def priority(self) -> Priority:
        return rules.tier_priority(self.service_tier)

    def sampling(self) -> dict:
        return rules.sampling(
            temperature=self.temperature, top_p=self.top_p, seed=self.seed,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            top_k=self.top_k, min_p=self.min_p, repeat_penalty=self.repeat_penalty,
            max_tokens=self.max_tokens, stop=self.stop, grammar=self.grammar,
            logit_bias=rules.logit_bias_pairs(self.logit_bias),
        )  # fmt: skip

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
    tool_choice: ToolChoice = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs = None
    # Thinking: "none" and "minimal" turn a thinking mode off, the levels turn it on
    # (dashboard.api.rules).
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None

    @property
    def think(self) -> Think:
        """The switch the template gets: off when a grammar constrains the output."""
        return rules.think_switch(rules.effort_switch(self.reasoning_effort), self._constrained)

    @property
    def _constrained(self) -> bool:
        format_ = self.response_format
        return self.grammar is not None or (format_ is not None and format_.constrains)

    @field_validator("reasoning_effort")
    @classmethod
    def _think_without_grammar(cls, value: str | None, info: ValidationInfo) -> str | None:
        format_ = info.data.get("response_format")
        constrained = info.data.get("grammar") is not None or (
            format_ is not None and format_.constrains
        )
        rules.no_thinking_under_a_grammar(
            rules.effort_switch(value), constrained, switch="reasoning_effort",
            constraint="a json response_format or grammar", off="reasoning_effort: none",
        )  # fmt: skip
        return value

    @field_validator("response_format")
    @classmethod
    def _one_grammar(cls, value: ResponseFormat | None, info: ValidationInfo):
        constraining = value if value is not None and value.constrains else None
        rules.one_grammar(info.data.get("grammar"), constraining, "response_format")
        return value

    def sampling(self) -> dict:
        params = super().sampling()
        logprobs = rules.logprobs_asked(self.logprobs, self.top_logprobs)
        grammar = self.response_format.grammar() if self.response_format else None
        return {**params, **rules.sampling(logprobs=logprobs,
                                           max_tokens=self.max_completion_tokens,
                                           grammar=grammar)}  # fmt: skip

    @property
    def active_tools(self) -> list[dict] | None:
        if not self.tools or self.tool_choice == "none":
            return None
        return [tool.model_dump(exclude_none=True) for tool in self.tools]

    def chat_messages(self) -> list[dict]:
        """The messages as the answer pipeline reads them (every dialect's chat_messages()): a
        content of parts stays parts, its images the Images read from them."""
        return [{**m.model_dump(exclude_none=True, exclude={"content"}),
                 **({"content": m.content} if m.content is not None else {})}
                for m in self.messages]  # fmt: skip

    def ask(self) -> Ask:
        return Ask(
            model=self.model, messages=self.chat_messages(),
            tools=self.active_tools, parallel_tool_calls=self.parallel_tool_calls is not False,
            think=self.think, think_param="reasoning_effort", sampling=self.sampling(),
            priority=self.priority, choices=self.n,
        )  # fmt: skip


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
    # The text after the insertion point: with it, `prompt` is the text before, and the answer
    # fills the middle (dashboard.api.fim), laid out as llama-server's /infill without
    # input_extra.
    suffix: PromptText | None = None
    best_of: Annotated[
        int | None, refuse_if(lambda v: v != 1, "best_of is not supported: ask for n choices")
    ] = None
    # The legacy form: the sampled token's log-probability and this many likeliest beside it.
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None

    def sampling(self) -> dict:
        return {**super().sampling(), **rules.sampling(logprobs=self.logprobs)}

    def ask(self) -> Ask:
        if self.suffix:
            return Ask(model=self.model, infill=InfillText(prefix=self.prompt, suffix=self.suffix),
                       sampling=self.sampling(), priority=self.priority)  # fmt: skip
        return Ask(model=self.model, prompt=self.prompt, sampling=self.sampling(),
                   priority=self.priority, choices=self.n)  # fmt: skip


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
