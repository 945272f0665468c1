"""GGUF model files: a validating reader and sandboxed chat-template rendering. Imports no Django.

Public interface:
    read_gguf(path) -> GGUFInfo      (raises GGUFError on anything it cannot trust)
    render_chat(template, messages, *, bos_token, eos_token, add_generation_prompt, tools,
                enable_thinking, reasoning_effort) -> str
        (raises ChatTemplateError; template None renders ChatML)
"""

from inference.gguf.chat_template import CHATML_TEMPLATE, ChatTemplateError, render_chat
from inference.gguf.reader import (
    FILE_TYPES,
    GGML_TYPES,
    GGML_TYPES_BY_NAME,
    ArraySummary,
    GGMLType,
    GGUFError,
    GGUFInfo,
    TensorInfo,
    read_gguf,
)

__all__ = [
    "CHATML_TEMPLATE", "FILE_TYPES", "GGML_TYPES", "GGML_TYPES_BY_NAME", "ArraySummary",
    "ChatTemplateError", "GGMLType", "GGUFError", "GGUFInfo", "TensorInfo", "read_gguf",
    "render_chat",
]  # fmt: skip
