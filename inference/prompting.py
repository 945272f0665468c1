"""Turning a conversation into the prompt text a model expects, through its chat template.

Templates come from GGUF metadata (or the admin's override) and are rendered only in a sandbox.
"""

from inference.gguf.chat_template import render_chat
from inference.models import LLMModel


def render_prompt(model: LLMModel, messages: list[dict], *, tools: list | None = None) -> str:
    """The model's chat template applied to `messages`, with the model's default system prompt
    placed first when the conversation has none."""
    if model.system_prompt and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": model.system_prompt}, *messages]
    return render_chat(
        model.effective_chat_template or None,
        messages,
        bos_token=model.metadata.get("bos_token", ""),
        eos_token=model.metadata.get("eos_token", ""),
        add_generation_prompt=True,
        tools=tools,
    )
