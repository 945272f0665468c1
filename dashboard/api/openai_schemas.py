"""OpenAI request bodies: /v1/chat/completions and /v1/completions."""

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from dashboard.api.schemas import (
    MAX_CONTENT_CHARS,
    MAX_MESSAGES,
    MAX_TOOLS,
    NO_GRAMMAR,
    Content,
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
    Unit,
    refuse_if,
    text_parts,
    total_chars,
)


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


class StreamOptions(Strict):
    include_usage: bool = False


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: dict[str, Any] | None = None


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

    def sampling(self) -> dict:
        fields = ("temperature", "top_p", "seed", "presence_penalty", "frequency_penalty",
                  "top_k", "min_p", "repeat_penalty")  # fmt: skip
        params = {name: getattr(self, name) for name in fields if getattr(self, name) is not None}
        if self.max_tokens is not None:
            params["max_tokens"] = self.max_tokens
        if self.stop:
            params["stop"] = tuple(self.stop)
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
    response_format: Annotated[
        ResponseFormat | None,
        refuse_if(lambda v: v.type != "text", f"response_format json_object {NO_GRAMMAR}"),
    ] = None
    logprobs: Annotated[
        bool | None, refuse_if(bool, "logprobs are not supported by this engine")
    ] = None
    top_logprobs: Annotated[int, Field(ge=0, le=20)] | None = None

    def sampling(self) -> dict:
        params = super().sampling()
        if self.max_completion_tokens is not None:
            params["max_tokens"] = self.max_completion_tokens
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
    logprobs: Annotated[
        int | None, refuse_if(lambda v: True, "logprobs are not supported by this engine")
    ] = None
