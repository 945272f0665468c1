"""Turning a conversation into the prompt text a model expects, through its chat template.

Templates come from GGUF metadata (or the admin's override) and are rendered only in a sandbox,
inside a render process with memory, CPU and wall-clock limits (inference.gguf.render_pool).
"""

from inference.gguf.render_pool import render_chat_isolated, render_executor
from inference.models import LLMModel

__all__ = ["render_executor", "render_prompt"]


def render_prompt(model: LLMModel, messages: list[dict], *, tools: list | None = None) -> str:
    """The model's chat template applied to `messages`, with the model's default system prompt
    placed first when the conversation has none.

    Blocks up to ~5 s; from async code, run it in render_executor(), not the default pool."""
    if model.system_prompt and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": model.system_prompt}, *messages]
    return render_chat_isolated(
        model.effective_chat_template or None,
        messages,
        bos_token=model.metadata.get("bos_token", ""),
        eos_token=model.metadata.get("eos_token", ""),
        add_generation_prompt=True,
        tools=tools,
    )
