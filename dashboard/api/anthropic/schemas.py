"""Anthropic request bodies: /v1/messages and /v1/messages/count_tokens.

A conversation arrives as Anthropic writes it (a top-level `system`, content blocks, tool_use
blocks in assistant turns and tool_result blocks in user turns) and leaves `chat_messages()`
as the OpenAI-style messages the answer pipeline reads (`ask()`: dashboard.api.pipeline): a
tool_use is a tool call, a tool_result a tool message, a thinking block the turn's
reasoning_content, an image block (base64) an image among the turn's parts, where it was (in a
tool_result too: among the tool message's parts).
"""

import json
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BeforeValidator, Field, model_validator

from dashboard.api import rules
from dashboard.api.bodies import (
    MAX_CONTENT_CHARS,
    MAX_MESSAGES,
    MAX_TOOLS,
    Content,
    MaxTokens,
    ModelName,
    ShortText,
    StopList,
    Strict,
    ToolDescription,
    ToolName,
    TopK,
    Unit,
    check_prompt_chars,
    refuse_if,
)
from dashboard.api.images import Base64Image, text_chars
from dashboard.api.pipeline import Ask
from inference.engine.media import Image

BLOCK_TYPES = ("text", "image", "tool_use", "tool_result", "thinking", "redacted_thinking")


def _known_blocks(value: Any) -> Any:
    """A string as one text block (so that an error inside a block is reported as the block's,
    not as the string's); a clear 400 for a block this engine cannot take (document, ...)."""
    if isinstance(value, str):
        return [{"type": "text", "text": value}]
    if isinstance(value, list):
        for block in value:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            if kind not in BLOCK_TYPES:
                raise ValueError(f"content blocks of type {kind!r} are not supported: text, "
                                 "image, tool_use, tool_result and thinking only")  # fmt: skip
    return value


class TextBlock(Strict):
    type: Literal["text"]
    text: Content


class ImageSource(Strict):
    """An image's bytes, in base64: the appliance fetches no `url` source and keeps no files."""

    type: Annotated[
        Literal["base64", "url", "file"],
        refuse_if(lambda v: v != "base64", "image sources are base64 only: url sources are not "
                  "fetched, and files are not kept"),
    ]  # fmt: skip
    media_type: Literal["image/jpeg", "image/png", "image/gif", "image/webp", "image/bmp"] = (
        "image/jpeg"
    )
    data: Base64Image | None = None

    @model_validator(mode="after")
    def _has_data(self) -> "ImageSource":
        if self.data is None:
            raise ValueError("a base64 image source needs its data")
        return self


class ImageBlock(Strict):
    type: Literal["image"]
    source: ImageSource

    @property
    def image(self) -> Image:
        return self.source.data


class ToolUseBlock(Strict):
    type: Literal["tool_use"]
    id: ShortText
    name: ToolName
    input: dict[str, Any] = Field(default_factory=dict)


class ToolResultBlock(Strict):
    """A tool's answer: text, or text and image blocks (a screenshot, a camera's snapshot), as
    llama-server takes it: the tool message then holds the images among its parts."""

    type: Literal["tool_result"]
    tool_use_id: ShortText
    content: Content | list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] = ""
    is_error: bool | None = None

    @property
    def parts(self) -> Content | list:
        if isinstance(self.content, str):
            return self.content
        return _content([b.image if isinstance(b, ImageBlock) else b.text for b in self.content])


class ThinkingBlock(Strict):
    type: Literal["thinking"]
    thinking: Content
    signature: Annotated[str, Field(max_length=MAX_CONTENT_CHARS)] = ""


class RedactedThinkingBlock(Strict):
    """Another server's encrypted thinking: nothing a local template can read, so dropped."""

    type: Literal["redacted_thinking"]
    data: Annotated[str, Field(max_length=MAX_CONTENT_CHARS)] = ""


Block = Annotated[
    TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
    | RedactedThinkingBlock,
    Field(discriminator="type"),
]
Blocks = Annotated[list[Block], Field(max_length=MAX_MESSAGES)]


class AnthropicMessage(Strict):
    role: Literal["user", "assistant"]
    content: Annotated[
        Blocks, BeforeValidator(_known_blocks, json_schema_input_type=Content | Blocks)
    ]

    @property
    def blocks(self) -> list:
        return list(self.content)

    @property
    def chars(self) -> int:
        total = 0
        for block in self.blocks:
            if isinstance(block, TextBlock):
                total += len(block.text)
            elif isinstance(block, ToolResultBlock):
                total += text_chars(block.parts)
            elif isinstance(block, ThinkingBlock):
                total += len(block.thinking)
            elif isinstance(block, ToolUseBlock):
                total += len(json.dumps(block.input))
        return total


class AnthropicTool(Strict):
    """A client tool (a function); Anthropic's server tools (web search, bash) run there."""

    type: Literal["custom"] | None = None
    name: ToolName
    description: ToolDescription | None = None
    # As chat completions' `parameters`: what the template shows; a schema the tool grammar
    # cannot hold calls to leaves the calls parsed unconstrained (dashboard.api.tools).
    input_schema: dict[str, Any]

    def function(self) -> dict:
        spec: dict = {"name": self.name, "parameters": self.input_schema}
        if self.description:
            spec["description"] = self.description
        return {"type": "function", "function": spec}


class ToolChoice(Strict):
    type: Literal["auto", "none", "any", "tool"]
    name: ToolName | None = None
    disable_parallel_tool_use: bool | None = None

    @model_validator(mode="after")
    def _engine_can_do_it(self) -> "ToolChoice":
        if self.type in ("any", "tool"):
            raise ValueError("tool_choice can be 'auto' or 'none': this engine cannot force a "
                             "tool call")  # fmt: skip
        return self


class Thinking(Strict):
    """Extended thinking: enabled turns a thinking template's mode on. The budget is accepted
    and bounded, not enforced apart: max_tokens bounds the thinking and the answer together."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[int, Field(ge=1, le=1 << 20)] | None = None


def _total_chars(messages: list[AnthropicMessage]) -> list[AnthropicMessage]:
    check_prompt_chars(sum(message.chars for message in messages))
    return messages


def _system_text(value: Any) -> Any:
    """`system` as a string or as text blocks → one string."""
    if isinstance(value, list):
        texts = []
        for block in value:
            if not isinstance(block, dict) or block.get("type") != "text":
                raise ValueError("system blocks must be text blocks")
            if not isinstance(block.get("text"), str):
                raise ValueError("a text block needs a string 'text'")
            texts.append(block["text"])
        return "\n".join(texts)
    return value


class CountTokensRequest(Strict):
    """What /v1/messages/count_tokens reads: the conversation, its tools and thinking switch."""

    model: ModelName = ""
    messages: Annotated[
        list[AnthropicMessage],
        Field(min_length=1, max_length=MAX_MESSAGES),
        AfterValidator(_total_chars),
    ]
    system: Annotated[
        Content | None, BeforeValidator(_system_text, json_schema_input_type=Content |
                                        list[TextBlock] | None),
    ] = None  # fmt: skip
    tools: Annotated[list[AnthropicTool], Field(max_length=MAX_TOOLS)] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None

    @property
    def think(self) -> bool | None:
        if self.thinking is None:
            return None
        return self.thinking.type != "disabled"

    @property
    def active_tools(self) -> list[dict] | None:
        if not self.tools or (self.tool_choice and self.tool_choice.type == "none"):
            return None
        return [tool.function() for tool in self.tools]

    @property
    def parallel_tool_calls(self) -> bool:
        return not (self.tool_choice and self.tool_choice.disable_parallel_tool_use)

    def ask(self) -> Ask:
        return Ask(model=self.model, messages=self.chat_messages(), tools=self.active_tools,
                   parallel_tool_calls=self.parallel_tool_calls, think=self.think,
                   think_param="thinking")  # fmt: skip

    def chat_messages(self) -> list[dict]:
        """The conversation as the prompt path reads it (OpenAI-style messages): the system
        first; a user turn's tool_result blocks as tool messages (named after the call they
        answer) before its text; an assistant turn's tool_use blocks as its tool calls."""
        out: list[dict] = [{"role": "system", "content": self.system}] if self.system else []
        names: dict[str, str] = {}  # tool_use id → the tool's name
        for message in self.messages:
            texts, calls, thinking = [], [], []  # texts: its text and images, in order
            for block in message.blocks:
                if isinstance(block, TextBlock):
                    texts.append(block.text)
                elif isinstance(block, ImageBlock):
                    texts.append(block.image)
                elif isinstance(block, ThinkingBlock):
                    thinking.append(block.thinking)
                elif isinstance(block, ToolUseBlock):
                    names[block.id] = block.name
                    function = {"name": block.name, "arguments": block.input}
                    calls.append({"id": block.id, "type": "function", "function": function})
                elif isinstance(block, ToolResultBlock):
                    result = {"role": "tool", "content": block.parts,
                              "tool_call_id": block.tool_use_id}  # fmt: skip
                    if block.tool_use_id in names:
                        result["name"] = names[block.tool_use_id]
                    out.append(result)
            if message.role == "assistant":
                turn: dict = {"role": "assistant", "content": _content(texts)}
                if calls:
                    turn["tool_calls"] = calls
                if thinking:
                    turn["reasoning_content"] = "\n".join(thinking)
                out.append(turn)
            elif texts or not any(isinstance(b, ToolResultBlock) for b in message.blocks):
                out.append({"role": "user", "content": _content(texts)})
        return out


def _content(parts: list) -> Content | list:
    """A turn's text blocks joined by newlines; with images, its parts in order (the prompt
    joins them as llama-server does: inference.text.prompting)."""
    return "\n".join(parts) if all(isinstance(p, str) for p in parts) else parts


class MessagesRequest(CountTokensRequest):
    max_tokens: MaxTokens  # required, as Anthropic has it
    stop_sequences: StopList | None = None
    temperature: Unit | None = None  # Anthropic's range: 0 to 1
    top_p: Unit | None = None
    top_k: TopK | None = None
    stream: bool = False
    metadata: dict[str, Any] | None = None  # user_id: nothing the appliance keeps
    service_tier: Literal["auto", "standard_only"] | None = None

    def sampling(self) -> dict:
        return rules.sampling(max_tokens=self.max_tokens, temperature=self.temperature,
                              top_p=self.top_p, top_k=self.top_k,
                              stop=self.stop_sequences)  # fmt: skip

    def ask(self) -> Ask:
        ask = super().ask()
        ask.sampling = self.sampling()
        return ask
