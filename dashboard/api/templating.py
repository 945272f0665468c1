"""The answer pipeline's prompt step (dashboard.api.pipeline): from a request's messages to the
prompt, through the model's own chat template (the same path as the chat page's:
inference.text.prompting), plus what only the API offers: tools. Every dialect's conversation
arrives here as OpenAI-style messages (each body's `ask()` maps its own onto them), a content
either text or parts with images (rendered as llama-server renders them: prompting).

Tools are handed to the template only when the template reads them, and tool calls are parsed
out of answers only when the template's format marks them (<tool_call> blocks); with any other
template a request with tools gets a plain answer.

Thinking (inference.text.thinking): a template with a thinking mode gets the request's switch,
and its answers have their <think> block split off, whatever the switch (a model that thinks
though asked not to still gives a clean answer); asking a model without one to think is a 400
naming the field, as Ollama does.
"""

import asyncio
import json
from dataclasses import dataclass

from dashboard.api.answer_parser import AnswerParser
from dashboard.api.errors import ApiError, from_refusal
from dashboard.api.tools import (
    ToolCallParser,
    template_marks_tool_calls,
    template_renders_tools,
    tool_constraint,
)
from inference.engine.refusals import Refused
from inference.gguf.chat_template import ChatTemplateError
from inference.models import LLMModel
from inference.text.prompting import Content, Prompt, prompt_for, render_executor
from inference.text.prompting import raw_prompt as plain_raw_prompt
from inference.text.thinking import Think, thinking_mode


@dataclass(slots=True)
class ChatPrompt:
    prompt: Prompt  # the text, its BOS rule and its thinking split
    tool_names: set[str] | None  # set: parse <tool_call> blocks naming these tools
    tools: list[dict] | None = None  # the offered tools, where calls are parsed

    @property
    def text(self) -> str:
        return self.prompt.text

    @property
    def thinking(self) -> bool:
        return self.prompt.thinking

    @property
    def opens_thinking(self) -> bool:
        return self.prompt.opens_thinking

    def tool_parser(self) -> ToolCallParser | None:
        return ToolCallParser(self.tool_names) if self.tool_names else None

    def constrain(self, params: dict, *, parallel: bool = True) -> dict:
        """The request's sampling params, plus the tool-call grammar where the answer may hold
        calls and the request sets no grammar of its own (a format constrains it all)."""
        if not self.tools or "grammar" in params:
            return params
        return {**params, **tool_constraint(self.tools, parallel=parallel)}

    def answer_parser(self) -> AnswerParser:
        return AnswerParser(self.prompt.splitter(), self.tool_parser())


def _arguments(value):
    """Templates expect a call's arguments as a mapping; OpenAI sends them as JSON text."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return parsed if isinstance(parsed, dict) else value
    return value


def template_message(message: dict) -> dict:
    """A message (OpenAI's shape, with Ollama's names too) as chat templates read it (Hugging
    Face conventions); a content of parts with images is joined by prompting.prompt_for."""
    role = "system" if message["role"] == "developer" else message["role"]
    out = {"role": role, "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {"type": "function", **({"id": c["id"]} if c.get("id") else {}),
             "function": {"name": c["function"]["name"],
                          "arguments": _arguments(c["function"].get("arguments", {}))}}
            for c in message["tool_calls"]
        ]  # fmt: skip
    # Ollama's `thinking` and OpenAI's `reasoning_content` are what Qwen3-style templates read
    # as `reasoning_content` (to keep or drop the thinking of earlier turns).
    renames = (("name", "name"), ("tool_name", "name"), ("tool_call_id", "tool_call_id"),
               ("thinking", "reasoning_content"),
               ("reasoning_content", "reasoning_content"))  # fmt: skip
    for source, target in renames:
        if message.get(source):
            out[target] = message[source]
    return out


def check_think(model: LLMModel, think: Think, param: str = "think") -> None:
    """Asking a model without a thinking mode to think is a 400; false is fine for any model
    (Home Assistant sends think: false with every request)."""
    if think not in (None, False) and not thinking_mode(model.effective_chat_template):
        raise ApiError(400, f'"{model.name}" does not support thinking: its chat template has '
                       "no thinking mode", param=param, code="unsupported_value")  # fmt: skip


def _render(
    model: LLMModel,
    messages: list[dict],
    tools: list[dict] | None,
    think: Think = None,
    think_param: str = "think",
) -> ChatPrompt:
    template = model.effective_chat_template
    check_think(model, think, think_param)
    use_tools = bool(tools) and template_renders_tools(template)
    try:
        prompt = prompt_for(
            model, [template_message(m) for m in messages], tools=tools if use_tools else None,
            think=think,
        )  # fmt: skip
    except ChatTemplateError as exc:
        raise ApiError(400, f"the model's chat template refused this conversation: {exc}",
                       param="messages", code="chat_template_error") from None  # fmt: skip
    except Refused as exc:  # text that holds the media marker beside images
        raise from_refusal(exc) from None
    names = None
    if use_tools and template_marks_tool_calls(template):
        names = {t["function"]["name"] for t in tools}
    return ChatPrompt(prompt, names, tools if names else None)


async def chat_prompt(
    model: LLMModel,
    messages: list[dict],
    tools: list[dict] | None,
    *,
    think: Think = None,
    think_param: str = "think",
) -> ChatPrompt:
    """The prompt for a conversation; `think_param` names the request's switch in a 400."""
    # A template may take up to ~5 s (it runs in a limited render process): off the event loop,
    # in the renderer's own threads so that a slow template leaves the default pool free.
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        render_executor(), _render, model, messages, tools, think, think_param
    )


def raw_prompt(model: LLMModel, prompt: Content, think: Think = None) -> ChatPrompt:
    """A prompt sent as is (Ollama's raw: true, OpenAI's completions), with its images where
    they go."""
    check_think(model, think)
    try:
        return ChatPrompt(plain_raw_prompt(model, prompt, think), None)
    except Refused as exc:
        raise from_refusal(exc) from None
