"""OpenAI Responses request bodies (/v1/responses), and their conversation as chat messages.

The endpoint is stateless, as Ollama's and llama-server's are: nothing is stored, so
`previous_response_id`, `conversation`, `background` and item references are refused with a
400 that says to send the whole conversation in `input`. `store: true` (OpenAI's default) is
accepted and answered with `store: false`: the response says that it was not kept.

`input` (a string, or message, reasoning, function_call and function_call_output items) becomes
the chat messages that chat completions takes (`chat_messages()`; a message's input_image parts
its images, dashboard.api.images), so both go through the same answer pipeline (`ask()`:
dashboard.api.pipeline) with the same tools, thinking and grammars (dashboard.api.rules).
"""

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
    MAX_TOOLS,
    Content,
    MaxTokens,
    ModelName,
    PromptText,
    ShortText,
    Strict,
    ToolDescription,
    ToolName,
    Unit,
    check_prompt_chars,
    refuse_if,
)
from dashboard.api.images import Parts, image_from_url, text_chars
from dashboard.api.openai.schemas import ToolChoice
from dashboard.api.pipeline import Ask
from inference.engine.generation import Priority
from inference.text.thinking import Think

STATELESS = "this appliance keeps no responses (stateless): send the whole conversation in input"
TEXT_PARTS = ("input_text", "output_text", "text", "reasoning_text", "summary_text")


def response_parts(value: Any, *, images: bool = False) -> Any:
    """Content parts (input_text, output_text, and with `images` input_image) → one string when
    they are all text (joined by newlines), else the parts: text, and each input_image's image
    (dashboard.api.images) where it was."""
    if not isinstance(value, list):
        return value
    parts: list = []
    for index, part in enumerate(value):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if images and kind == "input_image":
            if part.get("file_id"):
                raise ValueError(f"part {index} (input_image): file_id is not supported: "
                                 f"send image_url as a base64 data: URL; {STATELESS}")  # fmt: skip
            try:
                parts.append(image_from_url(part.get("image_url")))
            except ValueError as exc:
                raise ValueError(f"part {index} (input_image): {exc}") from None
            continue
        if kind not in TEXT_PARTS:
            only = "text and input_image" if images else "text only"
            raise ValueError(f"content parts of type {kind!r} are not supported: {only}")
        if not isinstance(part.get("text"), str):
            raise ValueError(f"a {kind} content part needs a string 'text'")
        parts.append(part["text"])
    if all(isinstance(part, str) for part in parts):
        return "\n".join(parts)
    return parts


PartsText = Annotated[
    Content, BeforeValidator(response_parts, json_schema_input_type=Content | list[dict])
]


class InputImagePart(Strict):
    """Responses' image part (what a body may send; validated into an Image)."""

    type: Literal["input_image"]
    image_url: Annotated[str, Field(description="a base64 data: URL; http(s) URLs are not "
                                    "fetched")]  # fmt: skip
    detail: Literal["auto", "low", "high"] | None = None


class MessageItem(Strict):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Annotated[
        Content | Parts,
        BeforeValidator(lambda value: response_parts(value, images=True),
                        json_schema_input_type=Content | list[dict | InputImagePart]),
    ]  # fmt: skip


class FunctionCallItem(Strict):
    """A call an earlier answer made (the output item, passed back in the input)."""

    type: Literal["function_call"]
    call_id: Annotated[str, Field(min_length=1, max_length=256)]
    name: Annotated[str, Field(min_length=1, max_length=64)]
    arguments: Annotated[str, Field(max_length=MAX_CONTENT_CHARS)] = "{}"


class FunctionCallOutputItem(Strict):
    type: Literal["function_call_output"]
    call_id: Annotated[str, Field(min_length=1, max_length=256)]
    output: PartsText


class ReasoningItem(Strict):
    """An earlier answer's thinking: its content (reasoning_text parts), else its summary."""

    type: Literal["reasoning"]
    summary: PartsText = ""
    content: PartsText | None = None

    @property
    def text(self) -> str:
        return self.content if self.content is not None else self.summary


ITEMS = {"message": MessageItem, "function_call": FunctionCallItem,
         "function_call_output": FunctionCallOutputItem, "reasoning": ReasoningItem}  # fmt: skip
InputItem = MessageItem | FunctionCallItem | FunctionCallOutputItem | ReasoningItem


def _item(value: Any) -> Any:
    """One input item as the model of its type (an item without a type is a message)."""
    if not isinstance(value, dict):
        return value
    kind = value.get("type", "message")
    if kind == "item_reference":
        raise ValueError(f"item references are not supported: {STATELESS}")
    if kind not in ITEMS:
        raise ValueError(f"input items of type {kind!r} are not supported: messages, reasoning, "
                         "function_call and function_call_output only")  # fmt: skip
    return {**value, "type": kind}


def _input(value: Any) -> Any:
    """A string is one user message."""
    return (
        [{"type": "message", "role": "user", "content": value}] if isinstance(value, str) else value
    )


def _chars(item: "InputItem") -> int:
    texts = (getattr(item, name, None) for name in ("content", "output", "arguments", "summary"))
    return sum(text_chars(text) for text in texts)


def _total_chars(items: list) -> list:
    check_prompt_chars(sum(_chars(item) for item in items))
    return items


Item = Annotated[
    InputItem,
    Field(discriminator="type"),
    BeforeValidator(_item),
]
Items = Annotated[list[Item], Field(min_length=1, max_length=MAX_MESSAGES)]


class FunctionTool(Strict):
    """A function tool as the Responses API sends it: flat, not under `function`."""

    type: Literal["function"]
    name: ToolName
    description: ToolDescription | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # the lazy tool grammar holds calls to the schema either way

    def chat(self) -> dict:
        function = {"name": self.name, "description": self.description,
                    "parameters": self.parameters}  # fmt: skip
        return {"type": "function", "function": {k: v for k, v in function.items() if v}}


def _function_tool(value: Any) -> Any:
    if isinstance(value, dict) and value.get("type") != "function":
        raise ValueError(f"tools of type {value.get('type')!r} are not supported: function "
                         "tools only")  # fmt: skip
    return value


class TextFormat(rules.OutputFormat, rules.SchemaFormat):
    """text; json_object (any JSON object); json_schema (flat: name, schema, strict)."""

    name: rules.FormatName = "response"

    @model_validator(mode="after")
    def _schema_given(self) -> "TextFormat":
        if self.type == "json_schema" and self.schema_ is None:
            raise ValueError("a json_schema format needs a schema")
        return self

    def output_schema(self) -> dict[str, Any] | None:
        return self.schema_

    def echo(self) -> dict:
        if self.type != "json_schema":
            return {"type": self.type}
        return {"type": "json_schema", "name": self.name, "schema": self.schema_,
                "description": self.description, "strict": self.strict}  # fmt: skip


class TextConfig(Strict):
    format: TextFormat | None = None


class Reasoning(Strict):
    # "none" and "minimal" turn a thinking mode off; the levels turn it on ("xhigh": "high").
    effort: rules.Effort | None = None
    summary: Literal["auto", "concise", "detailed"] | None = None  # the thinking is given whole


def _refuse_stateful(name: str):
    return refuse_if(bool, f"{name} is not supported: {STATELESS}")


class ResponsesRequest(Strict):
    model: ModelName = ""
    input: Annotated[
        Items,
        BeforeValidator(_input, json_schema_input_type=Content | list[InputItem]),
        AfterValidator(_total_chars),
        Field(description="a string (one user message) or message and function-call items"),
    ]
    instructions: PromptText | None = None  # a system message before the input
    max_output_tokens: MaxTokens | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] | None = None
    top_p: Unit | None = None
    tools: Annotated[
        list[Annotated[FunctionTool, BeforeValidator(_function_tool)]], Field(max_length=MAX_TOOLS)
    ] | None = None  # fmt: skip
    tool_choice: ToolChoice = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    reasoning: Reasoning | None = None
    stream: bool = False
    store: bool | None = None  # accepted, never kept: the response says store: false
    previous_response_id: Annotated[str | None, _refuse_stateful("previous_response_id")] = None
    conversation: Annotated[Any, _refuse_stateful("conversation")] = None
    background: Annotated[bool | None, _refuse_stateful("background")] = None
    truncation: Annotated[
        Literal["auto", "disabled"] | None,
        refuse_if(lambda v: v == "auto", "truncation 'auto' is not supported: a conversation "
                  "longer than the context is a 400, never cut"),
    ] = None  # fmt: skip
    include: Annotated[
        list[ShortText] | None,
        refuse_if(lambda v: any("logprobs" in i for i in v),
                  "logprobs are not served on /v1/responses: /v1/chat/completions has them"),
    ] = None  # fmt: skip
    top_logprobs: Annotated[
        int | None,
        refuse_if(lambda v: v > 0,
                  "logprobs are not served on /v1/responses: /v1/chat/completions has them"),
    ] = None  # fmt: skip
    metadata: Annotated[dict[str, ShortText], Field(max_length=16)] | None = None
    user: ShortText | None = None
    service_tier: rules.ServiceTier | None = None  # "flex": background (dashboard.api.rules)

    @field_validator("reasoning")
    @classmethod
    def _think_without_grammar(cls, value: Reasoning | None, info: ValidationInfo):
        text = info.data.get("text")
        constrained = text is not None and text.format is not None and text.format.constrains
        rules.no_thinking_under_a_grammar(
            rules.effort_switch(value.effort if value else None), constrained,
            switch="reasoning", constraint="a json text.format", off="reasoning: {effort: none}",
        )  # fmt: skip
        return value

    @property
    def format(self) -> TextFormat:
        return self.text.format if self.text and self.text.format else TextFormat()

    @property
    def think(self) -> Think:
        """The switch the template gets: off for a json format (dashboard.api.rules)."""
        effort = self.reasoning.effort if self.reasoning else None
        return rules.think_switch(rules.effort_switch(effort), self.format.constrains)

    @property
    def priority(self) -> Priority:
        return rules.tier_priority(self.service_tier)

    def sampling(self) -> dict:
        return rules.sampling(temperature=self.temperature, top_p=self.top_p,
                              max_tokens=self.max_output_tokens,
                              grammar=self.format.grammar())  # fmt: skip

    @property
    def active_tools(self) -> list[dict] | None:
        if not self.tools or self.tool_choice == "none":
            return None
        return [tool.chat() for tool in self.tools]

    def ask(self) -> Ask:
        return Ask(
            model=self.model, messages=self.chat_messages(), tools=self.active_tools,
            parallel_tool_calls=self.parallel_tool_calls is not False, think=self.think,
            think_param="reasoning", sampling=self.sampling(), priority=self.priority,
            images_param="input",
        )  # fmt: skip

    def chat_messages(self) -> list[dict]:
        """The conversation as chat messages (dashboard.api.templating.template_message reads
        them): instructions first, a call's items merged into the assistant turn that made it,
        an output as a tool message naming its call, a reasoning item as the thinking of the
        assistant turn after it."""
        out: list[dict] = []
        if self.instructions:
            out.append({"role": "system", "content": self.instructions})
        called: dict[str, str] = {}  # call_id → the function's name
        thinking = ""
        for item in self.input:
            if isinstance(item, ReasoningItem):
                thinking += item.text
            elif isinstance(item, MessageItem):
                message = {"role": item.role, "content": item.content}
                if item.role == "assistant" and thinking:
                    message["reasoning_content"], thinking = thinking, ""
                out.append(message)
            elif isinstance(item, FunctionCallItem):
                called[item.call_id] = item.name
                call = {"id": item.call_id, "type": "function",
                        "function": {"name": item.name, "arguments": item.arguments}}  # fmt: skip
                if not out or out[-1]["role"] != "assistant":
                    out.append({"role": "assistant", "content": ""})
                    if thinking:
                        out[-1]["reasoning_content"], thinking = thinking, ""
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                tool = {"role": "tool", "content": item.output, "tool_call_id": item.call_id}
                if item.call_id in called:
                    tool["name"] = called[item.call_id]
                out.append(tool)
        return out
