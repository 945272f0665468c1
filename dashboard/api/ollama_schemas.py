"""Ollama request bodies: /api/chat, /api/generate, /api/show and /api/delete."""

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field

from dashboard.api.schemas import (
    MAX_MESSAGES,
    MAX_NAME_CHARS,
    MAX_TOOLS,
    NO_GRAMMAR,
    Content,
    ModelName,
    Penalty,
    PromptText,
    RepeatLastN,
    RepeatPenalty,
    Stop,
    Strict,
    Tools,
    TopK,
    Unit,
    refuse_if,
    total_chars,
)
from inference.engine.params import MAX_TOKENS_LIMIT, SEED_LIMIT
from inference.registry import parse_keep_alive


def _keep_alive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, str | int | float | None):
        raise ValueError("keep_alive must be a duration such as 5m, 30s, 0 or -1")
    return parse_keep_alive(value)  # raises ValueError with the reason


KeepAlive = Annotated[
    float | None, BeforeValidator(_keep_alive, json_schema_input_type=str | float | None)
]
Format = Annotated[
    Literal[""] | None,
    BeforeValidator(lambda v: None if v in ("", None) else _refuse_format(),
                    json_schema_input_type=Literal["", "json"] | dict[str, Any] | None),
]  # fmt: skip
Think = Annotated[
    bool | None,
    BeforeValidator(lambda v: _refuse_think() if v not in (None, False) else v,
                    json_schema_input_type=bool | Literal["low", "medium", "high"] | None),
]  # fmt: skip
Images = Annotated[
    list[str] | None, refuse_if(bool, "images are not supported: this model takes text only")
]


def _refuse_format():
    raise ValueError(f"format json {NO_GRAMMAR}")


def _refuse_think():
    raise ValueError("this model does not think: think must be false")


def _num_predict(value: int | None) -> int | None:
    if value == 0:
        raise ValueError("num_predict must be at least 1, or -1 (no limit) or -2 (fill context)")
    return value


class OllamaOptions(Strict):
    num_ctx: Annotated[int, Field(ge=1, le=1 << 20)] | None = None  # informational: see /api/ps
    num_predict: Annotated[
        int | None, Field(ge=-2, le=MAX_TOKENS_LIMIT), AfterValidator(_num_predict)
    ] = None
    temperature: Annotated[float, Field(ge=0.0, le=5.0)] | None = None
    top_k: TopK | None = None
    top_p: Unit | None = None
    min_p: Unit | None = None
    seed: Annotated[int, Field(ge=-1, le=SEED_LIMIT)] | None = None  # -1: random, as Ollama
    stop: Stop = None
    repeat_penalty: RepeatPenalty | None = None
    repeat_last_n: RepeatLastN | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None

    def sampling(self) -> dict:
        fields = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n",
                  "presence_penalty", "frequency_penalty")  # fmt: skip
        params = {name: getattr(self, name) for name in fields if getattr(self, name) is not None}
        if self.seed is not None and self.seed >= 0:
            params["seed"] = self.seed
        if self.num_predict is not None:
            # -1 and -2: until the context is full (the engine clamps to what fits).
            params["max_tokens"] = self.num_predict if self.num_predict > 0 else MAX_TOKENS_LIMIT
        if self.stop:
            params["stop"] = tuple(self.stop)
        return params


class OllamaFunctionCall(Strict):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    arguments: dict[str, Any] = Field(default_factory=dict)


class OllamaToolCall(Strict):
    function: OllamaFunctionCall


class OllamaMessage(Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: Content = ""
    images: Images = None
    tool_calls: Annotated[list[OllamaToolCall], Field(max_length=MAX_TOOLS)] | None = None
    tool_name: Annotated[str, Field(max_length=64)] | None = None
    thinking: Content | None = None  # sent back by clients; this engine never produces it


class OllamaGenerationBase(Strict):
    model: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
    options: OllamaOptions | None = None
    stream: bool = True
    keep_alive: KeepAlive = None
    format: Format = None
    think: Think = None
    logprobs: Annotated[
        bool | None, refuse_if(bool, "logprobs are not supported by this engine")
    ] = None

    def sampling(self) -> dict:
        return self.options.sampling() if self.options else {}


class OllamaChatRequest(OllamaGenerationBase):
    messages: Annotated[
        list[OllamaMessage], Field(max_length=MAX_MESSAGES), AfterValidator(total_chars)
    ] = Field(default_factory=list)
    tools: Tools | None = None

    @property
    def active_tools(self) -> list[dict] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None


class OllamaGenerateRequest(OllamaGenerationBase):
    prompt: PromptText = ""
    system: Content | None = None
    raw: bool = False
    suffix: Annotated[
        str | None, refuse_if(bool, "suffix (fill-in-the-middle) is not supported")
    ] = None
    template: Annotated[
        str | None, refuse_if(bool, "template overrides are not supported: the model's own "
                              "chat template is used (or raw: true)")
    ] = None  # fmt: skip
    context: Annotated[
        list[int] | None, refuse_if(bool, "context is not supported: send the conversation "
                                    "to /api/chat instead")
    ] = None  # fmt: skip
    images: Images = None


class OllamaModelRequest(Strict):
    """/api/show and /api/delete: `model`, or `name` as older clients send."""

    model: ModelName = ""
    name: ModelName = ""
    verbose: bool = False

    @property
    def target(self) -> str:
        return self.model or self.name
