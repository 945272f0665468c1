"""From an API request's messages to the prompt text, through the model's own chat template.

Tools are handed to the template only when the template reads them, and tool calls are parsed
out of answers only when the template's format marks them (<tool_call> blocks); with any other
template a request with tools gets a plain answer.
"""

import asyncio
import json
from dataclasses import dataclass

from dashboard.api.errors import ApiError
from dashboard.api.tools import ToolCallParser, template_marks_tool_calls, template_renders_tools
from inference.gguf.chat_template import ChatTemplateError
from inference.models import LLMModel
from inference.prompting import render_executor, render_prompt


@dataclass(slots=True)
class ChatPrompt:
    text: str
    add_special: bool  # False when the template already wrote the BOS token
    tool_names: set[str] | None  # set: parse <tool_call> blocks naming these tools

    def tool_parser(self) -> ToolCallParser | None:
        return ToolCallParser(self.tool_names) if self.tool_names else None


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
    """An OpenAI or Ollama message as chat templates read it (Hugging Face conventions)."""
    role = "system" if message["role"] == "developer" else message["role"]
    out = {"role": role, "content": message.get("content") or ""}
    if message.get("tool_calls"):
        out["tool_calls"] = [
            {"type": "function", **({"id": c["id"]} if c.get("id") else {}),
             "function": {"name": c["function"]["name"],
                          "arguments": _arguments(c["function"].get("arguments", {}))}}
            for c in message["tool_calls"]
        ]  # fmt: skip
    renames = (("name", "name"), ("tool_name", "name"), ("tool_call_id", "tool_call_id"))
    for source, target in renames:
        if message.get(source):
            out[target] = message[source]
    return out


def _render(model: LLMModel, messages: list[dict], tools: list[dict] | None) -> ChatPrompt:
    template = model.effective_chat_template
    use_tools = bool(tools) and template_renders_tools(template)
    try:
        text = render_prompt(
            model, [template_message(m) for m in messages], tools=tools if use_tools else None
        )
    except ChatTemplateError as exc:
        raise ApiError(400, f"the model's chat template refused this conversation: {exc}",
                       param="messages", code="chat_template_error") from None  # fmt: skip
    bos = (model.metadata or {}).get("bos_token") or ""
    names = None
    if use_tools and template_marks_tool_calls(template):
        names = {t["function"]["name"] for t in tools}
    return ChatPrompt(text, not (bos and text.startswith(bos)), names)


async def chat_prompt(
    model: LLMModel, messages: list[dict], tools: list[dict] | None
) -> ChatPrompt:
    # A template may take up to ~5 s (it runs in a limited render process): off the event loop,
    # in the renderer's own threads so that a slow template leaves the default pool free.
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(render_executor(), _render, model, messages, tools)


def raw_add_special(model: LLMModel, prompt: str) -> bool:
    bos = (model.metadata or {}).get("bos_token") or ""
    return not (bos and prompt.startswith(bos))
