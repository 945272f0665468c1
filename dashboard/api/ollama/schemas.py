"""Ollama request bodies: /api/chat, /api/generate, /api/embed, /api/embeddings, /api/show,
/api/delete, /api/pull, /api/create and /api/copy; and what a generation body asks in the answer
pipeline's terms (`ask()`: dashboard.api.pipeline.Ask)."""

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from dashboard.api import rules
from dashboard.api.bodies import (
    MAX_MESSAGES,
    MAX_NAME_CHARS,
    MAX_TOOLS,
    Content,
    GrammarText,
    ModelName,
    Penalty,
    PromptText,
    RepeatLastN,
    RepeatPenalty,
    Stop,
    Strict,
    Tools,
    TopK,
    TopLogprobs,
    Unit,
    one_or_many,
    refuse_if,
    total_chars,
)
from dashboard.api.embedding import Dimensions, EmbedText, TextList
from dashboard.api.images import Base64Image, ollama_parts, ollama_raw_parts
from dashboard.api.pipeline import Ask
from inference.catalog.specs import parse_keep_alive
from inference.engine.generation import MAX_IMAGES
from inference.engine.params import MAX_TOKENS_LIMIT, SEED_LIMIT
from inference.text.infill import InfillText
from inference.text.structured import check_schema
from inference.text.thinking import LEVELS, Level


def _keep_alive(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, str | int | float | None):
        raise ValueError("keep_alive must be a duration such as 5m, 30s, 0 or -1")
    return parse_keep_alive(value)  # raises ValueError with the reason


KeepAlive = Annotated[
    float | None, BeforeValidator(_keep_alive, json_schema_input_type=str | float | None)
]
Format = Annotated[
    Literal["json"] | dict[str, Any] | None,
    BeforeValidator(lambda v: _format(v),
                    json_schema_input_type=Literal["", "json"] | dict[str, Any] | None),
]  # "json": any JSON object; a JSON schema: output that validates against it  # fmt: skip
Think = Annotated[
    bool | Level | None,
    BeforeValidator(lambda v: _think(v), json_schema_input_type=bool | Level | None),
]  # whether the model may think first; a model without a thinking mode refuses true (prompts.py)
# Base64 pictures, placed as Ollama places them (dashboard.api.images.ollama_parts).
Images = Annotated[list[Base64Image], Field(max_length=MAX_IMAGES)]


def _format(value: Any) -> Any:
    if value in ("", None):
        return None
    if value == "json":
        return "json"
    if isinstance(value, dict):
        return check_schema(value)  # a 400 naming what the grammar cannot enforce
    raise ValueError('format must be "json" or a JSON schema (an object)')


def _think(value: Any) -> Any:
    # gpt-oss's levels; for a model that can only switch thinking on or off they mean "on".
    if value is None or isinstance(value, bool) or value in LEVELS:
        return value
    raise ValueError('think must be true, false, "low", "medium" or "high"')


def _num_predict(value: int | None) -> int | None:
    if value == 0:
        raise ValueError("num_predict must be at least 1, or -1 (no limit) or -2 (fill context)")
    return value


class OllamaOptions(Strict):
    # The context per sequence asked: more than loaded reloads (catalog.specs.context_asked).
    num_ctx: Annotated[int, Field(ge=1, le=1 << 20, description=(
        "tokens per sequence; more than the loaded model holds reloads it once idle (507 if it "
        "cannot fit), less runs as loaded; clamped at the model's training context"
    ))] | None = None  # fmt: skip
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
        predict = self.num_predict
        return rules.sampling(
            temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
            repeat_penalty=self.repeat_penalty, repeat_last_n=self.repeat_last_n,
            presence_penalty=self.presence_penalty, frequency_penalty=self.frequency_penalty,
            seed=self.seed if self.seed is not None and self.seed >= 0 else None,
            # -1 and -2: until the context is full (the engine clamps to what fits).
            max_tokens=None if predict is None else predict if predict > 0 else MAX_TOKENS_LIMIT,
            stop=self.stop,
        )  # fmt: skip


class OllamaFunctionCall(Strict):
    name: Annotated[str, Field(min_length=1, max_length=64)]
    arguments: dict[str, Any] = Field(default_factory=dict)


class OllamaToolCall(Strict):
    function: OllamaFunctionCall


class OllamaMessage(Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: Content = ""
    images: Images | None = None
    tool_calls: Annotated[list[OllamaToolCall], Field(max_length=MAX_TOOLS)] | None = None
    tool_name: Annotated[str, Field(max_length=64)] | None = None
    thinking: Content | None = None  # an earlier answer's; templates read reasoning_content


class OllamaGenerationBase(Strict):
    model: Annotated[str, Field(min_length=1, max_length=MAX_NAME_CHARS)]
    options: OllamaOptions | None = None
    stream: bool = True
    keep_alive: KeepAlive = None
    format: Format = None
    # A GBNF grammar, as llama-server takes it (Ollama itself has none); not beside format.
    grammar: GrammarText | None = None
    think: Think = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs = None

    @field_validator("grammar")
    @classmethod
    def _one_grammar(cls, value: str | None, info: ValidationInfo) -> str | None:
        return rules.one_grammar(value, info.data.get("format"), "format")

    @field_validator("think")
    @classmethod
    def _think_without_grammar(cls, value: Think, info: ValidationInfo) -> Think:
        constrained = info.data.get("format") is not None or info.data.get("grammar") is not None
        rules.no_thinking_under_a_grammar(value, constrained, switch="think",
                                          constraint="format or grammar",
                                          off="think: false")  # fmt: skip
        return value

    @property
    def think_switch(self) -> bool | Level | None:
        """The switch the template gets: off when the output is constrained."""
        return rules.think_switch(self.think, self.format is not None or self.grammar is not None)

    def sampling(self) -> dict:
        params = self.options.sampling() if self.options else {}
        if self.format is not None:  # "json": any object; else a schema
            grammar = rules.format_grammar(None if self.format == "json" else self.format)
        else:
            grammar = self.grammar
        logprobs = rules.logprobs_asked(self.logprobs, self.top_logprobs)
        return {**params, **rules.sampling(logprobs=logprobs, grammar=grammar)}

    def ask(self) -> Ask:
        """What every generation body asks; each adds its conversation or prompt."""
        return Ask(model=self.model, think=self.think_switch, sampling=self.sampling(),
                   keep_alive=self.keep_alive,
                   num_ctx=self.options.num_ctx if self.options else None)  # fmt: skip


class OllamaChatRequest(OllamaGenerationBase):
    messages: Annotated[
        list[OllamaMessage], Field(max_length=MAX_MESSAGES), AfterValidator(total_chars)
    ] = Field(default_factory=list)
    tools: Tools | None = None

    @property
    def active_tools(self) -> list[dict] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    @property
    def loads_only(self) -> bool:
        """An empty conversation only loads (or, with keep_alive 0, unloads) the model."""
        return not self.messages

    def chat_messages(self) -> list[dict]:
        """The messages as the answer pipeline reads them: a message's images among its
        content's parts, where Ollama puts them."""
        return [{**m.model_dump(exclude_none=True, exclude={"images", "content"}),
                 "content": ollama_parts(m.content, m.images or [])}
                for m in self.messages]  # fmt: skip

    def ask(self) -> Ask:
        ask = super().ask()
        ask.messages = self.chat_messages()
        ask.tools = self.active_tools
        ask.images_param = "images"
        return ask


class OllamaGenerateRequest(OllamaGenerationBase):
    prompt: PromptText = ""
    system: Content | None = None
    raw: bool = False
    # The code after the cursor: with it, the prompt is the code before, and the answer fills
    # the middle (dashboard.api.fim), raw or not, as Continue asks it.
    suffix: PromptText | None = None
    template: Annotated[
        str | None, refuse_if(bool, "template overrides are not supported: the model's own "
                              "chat template is used (or raw: true)")
    ] = None  # fmt: skip
    context: Annotated[
        list[int] | None, refuse_if(bool, "context is not supported: send the conversation "
                                    "to /api/chat instead")
    ] = None  # fmt: skip
    images: Images | None = None

    _content: str | list = PrivateAttr(default="")  # the prompt, or its parts with images

    @model_validator(mode="after")
    def _place_images(self) -> "OllamaGenerateRequest":
        """The images placed in the prompt as in a chat message, as Ollama's generate does, or,
        raw, where its [img-N] tags say (dashboard.api.images: a 400 for a tag naming no
        image, or an image no tag names)."""
        images = self.images or []
        if images and self.suffix:
            raise ValueError("images cannot go with a suffix (fill-in-the-middle)")
        place = ollama_raw_parts if self.raw else ollama_parts
        self._content = place(self.prompt, images)
        return self

    @property
    def loads_only(self) -> bool:
        """An empty prompt (and no suffix) only loads (or, with keep_alive 0, unloads) the
        model."""
        return not self.prompt and not self.suffix

    def ask(self) -> Ask:
        """The prompt as a user message (raw: sent as is), with its images; or, with a
        suffix, the code around the middle to fill, as llama-server's /infill without
        input_extra lays it out."""
        ask = super().ask()
        content = self._content
        if self.suffix:
            ask.infill = InfillText(prefix=self.prompt, suffix=self.suffix)
        elif self.raw:
            ask.prompt = content
        else:
            ask.messages = [{"role": "user", "content": content}]
            if self.system:
                ask.messages.insert(0, {"role": "system", "content": self.system})
        ask.images_param = "images"
        return ask


class OllamaModelRequest(Strict):
    """/api/show and /api/delete: `model`, or `name` as older clients send."""

    model: ModelName = ""
    name: ModelName = ""
    verbose: bool = False

    @property
    def target(self) -> str:
        return self.model or self.name


class OllamaPullRequest(Strict):
    """/api/pull: the name to pull (`model`, or `name`), `insecure` for plain http to a
    registry the name itself names, and `stream` (default true) for progress lines."""

    model: ModelName = ""
    name: ModelName = ""
    insecure: bool = False
    stream: bool = True

    @property
    def target(self) -> str:
        return self.model or self.name


class OllamaCreateRequest(Strict):
    """/api/create: a model from an uploaded blob (`files`: {"name.gguf": "sha256:…"}) or
    `from` an existing one, with its own system prompt, parameters, template and messages (and,
    made of a file, a `draft` model)."""

    model: ModelName = ""
    name: ModelName = ""
    from_: ModelName = Field("", alias="from")
    files: dict[str, Annotated[str, Field(max_length=80)]] | None = Field(None, max_length=16)
    adapters: dict[str, str] | None = None
    template: str | None = Field(None, max_length=64_000)
    license: str | list[str] | None = None
    system: str | None = Field(None, max_length=32_000)
    parameters: dict[str, Any] | None = Field(None, max_length=64)
    messages: list[dict[str, Any]] | None = Field(None, max_length=64)
    quantize: str | None = None
    # A draft model for speculation (a catalog model's name), for a model made of its own file:
    # llama-server's --model-draft, the model page's "Draft model".
    draft: ModelName = ""
    stream: bool = True

    @property
    def target(self) -> str:
        return self.model or self.name

    @property
    def license_text(self) -> str | None:
        return "\n".join(self.license) if isinstance(self.license, list) else self.license


class OllamaCopyRequest(Strict):
    """/api/copy: another name for a model."""

    source: ModelName
    destination: ModelName


class OllamaEmbedRequest(Strict):
    """/api/embed: `input` a string or a list of strings; an empty input loads the model."""

    model: Annotated[str, Field(min_length=1, max_length=200)]
    input: Annotated[
        TextList, BeforeValidator(one_or_many, json_schema_input_type=EmbedText | TextList)
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
