"""Turning a conversation into the prompt text a model expects, through its chat template.

Templates come from GGUF metadata (or the admin's override) and are rendered only in a sandbox,
inside a render process with memory, CPU and wall-clock limits (inference.gguf.render_pool).

The request's thinking switch (inference.thinking) is applied here, so the chat page and the
API switch it the same way: the template gets `enable_thinking` / `reasoning_effort`, and a
template that opens a <think> block in the prompt without a switch of its own (DeepSeek-R1)
gets the block closed when thinking is off.
"""

from inference.gguf.render_pool import render_chat_isolated, render_executor
from inference.models import LLMModel
from inference.thinking import Think, close_thinking, prompt_opens_thinking, template_variables

__all__ = ["render_executor", "render_prompt"]


def render_prompt(
    model: LLMModel, messages: list[dict], *, tools: list | None = None, think: Think = None
) -> str:
    """The model's chat template applied to `messages`, with the model's default system prompt
    placed first when the conversation has none. `think`: None leaves thinking to the template,
    False turns it off, True or a level ("low", "medium", "high") turns it on.

    Blocks up to ~5 s; from async code, run it in render_executor(), not the default pool."""
    if model.system_prompt and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": model.system_prompt}, *messages]
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
