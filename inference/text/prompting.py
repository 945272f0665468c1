"""Turning a conversation into the prompt text a model expects, through its chat template.

Templates come from GGUF metadata (or the admin's override) and are rendered only in a sandbox,
inside a render process with memory, CPU and wall-clock limits (inference.gguf.render_pool).

One path for the chat page and every API dialect (`prompt_for`, `raw_prompt`), so the same
messages give the same tokens whichever way they arrive: the BOS token is added unless the
template wrote it (`add_special`), and the answer's thinking is split the same way.

The request's thinking switch (inference.text.thinking) is applied here too: the template gets
`enable_thinking` / `reasoning_effort`, and a template that opens a <think> block in the prompt
without a switch of its own (DeepSeek-R1) gets the block closed when thinking is off.
"""

from dataclasses import dataclass

from inference.gguf.render_pool import render_chat_isolated, render_executor
from inference.models import LLMModel
from inference.text.thinking import (
    Think,
    ThinkingSplitter,
    close_thinking,
    prompt_opens_thinking,
    template_variables,
    thinking_mode,
)

__all__ = ["Prompt", "prompt_for", "raw_prompt", "render_executor", "render_prompt"]


@dataclass(slots=True, frozen=True)
class Prompt:
    """A rendered prompt and how to read the answer to it."""

    text: str
    add_special: bool  # False when the text already starts with the model's BOS token
    thinking: bool = False  # the answer may open with a <think> block: split it off
    opens_thinking: bool = False  # the prompt ends inside that block: the answer starts in it

    def splitter(self) -> ThinkingSplitter | None:
        return ThinkingSplitter(inside=self.opens_thinking) if self.thinking else None

    def then(self, written: str) -> "Prompt":
        """This prompt with `written` appended (a Continue writes on from a partial answer,
        past any thinking)."""
        return Prompt(self.text + written, self.add_special)


def add_special(model: LLMModel, text: str) -> bool:
    """Whether the tokenizer must add the BOS token: not when the text starts with it (a
    template that writes its own would otherwise get a second one)."""
    bos = (model.metadata or {}).get("bos_token") or ""
    return not (bos and text.startswith(bos))


def prompt_for(
    model: LLMModel, messages: list[dict], *, tools: list | None = None, think: Think = None
) -> Prompt:
    """The prompt of a conversation (see render_prompt), for the chat page and the API alike."""
    text = render_prompt(model, messages, tools=tools, think=think)
    thinks = bool(thinking_mode(model.effective_chat_template))
    return Prompt(text, add_special(model, text), thinks, thinks and prompt_opens_thinking(text))


def raw_prompt(model: LLMModel, text: str, think: Think = None) -> Prompt:
    """A prompt sent as is (Ollama's raw: true): its answer is split only when asked to think,
    starting inside the block when the prompt opened one."""
    thinks = think not in (None, False)
    return Prompt(text, add_special(model, text), thinks, thinks and prompt_opens_thinking(text))


def with_model_messages(model: LLMModel, messages: list[dict]) -> list[dict]:
    """The conversation as the model gets it: its default system prompt first when the
    conversation has none, then its seed messages (a derived model's MESSAGE lines), then the
    conversation's own after any system message it opens with."""
    if model.system_prompt and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": model.system_prompt}, *messages]
    seed = [m for m in model.seed_messages or () if isinstance(m, dict)]
    if not seed:
        return messages
    lead = 0
    while lead < len(messages) and messages[lead].get("role") == "system":
        lead += 1
    return [*messages[:lead], *seed, *messages[lead:]]


def render_prompt(
    model: LLMModel, messages: list[dict], *, tools: list | None = None, think: Think = None
) -> str:
    """The model's chat template applied to `messages`, with the model's default system prompt
    and seed messages placed first (with_model_messages). `think`: None leaves thinking to the
    template, False turns it off, True or a level ("low", "medium", "high") turns it on.

    Blocks up to ~5 s; from async code, run it in render_executor(), not the default pool."""
    messages = with_model_messages(model, messages)
    template = model.effective_chat_template or None
    prompt = render_chat_isolated(
        template,
        messages,
        bos_token=model.metadata.get("bos_token", ""),
        eos_token=model.metadata.get("eos_token", ""),
        add_generation_prompt=True,
        tools=tools,
        **template_variables(template, think),
    )
    if think is False and prompt_opens_thinking(prompt):
        prompt = close_thinking(prompt)
    return prompt
