"""Whether one catalog model can be another's draft model, from what their GGUF headers say.

The runner checks every token's text when it loads the pair (inference.engine.draft_model);
this is the check a person gets when choosing one, before anything loads: the same tokenizer,
the same special tokens, a vocabulary of about the same size, and a smaller model.
"""

from inference.gguf import GGUFError
from inference.models import LLMModel
from inference.planning.preflight import gguf_info

VOCAB_SIZE_SLACK = 128  # llama.cpp's own slack between a draft's vocabulary and its target's
_SAME = (
    ("tokenizer.ggml.model", "its tokenizer is of another kind"),
    ("tokenizer.ggml.pre", "it splits text into tokens differently"),
    ("tokenizer.ggml.bos_token_id", "its beginning-of-text token differs"),
    ("tokenizer.ggml.eos_token_id", "its end-of-text token differs"),
)


def draft_problem(model: LLMModel, draft: LLMModel) -> str | None:
    """Why `draft` cannot draft for `model` (None: it can, as far as the headers tell)."""
    model, draft = model.weights, draft.weights
    if model.pk is not None and draft.pk == model.pk:
        return "a model cannot be its own draft model"
    return file_problem(model.file_path, draft)


def file_problem(target_path: str, draft: LLMModel) -> str | None:
    """draft_problem for a model still to be made of the GGUF at `target_path` (a blob)."""
    try:
        target_info = gguf_info(target_path)
        draft_info = gguf_info(draft.weights.file_path)
    except (GGUFError, OSError) as exc:
        return f"its file cannot be read: {exc}"
    if draft_info.weights_bytes >= target_info.weights_bytes:
        return "it is not smaller than the model: its guesses would cost more than they save"
    for key, problem in _SAME:
        if target_info.metadata.get(key) != draft_info.metadata.get(key):
            return problem
    n_target, n_draft = target_info.vocab_size or 0, draft_info.vocab_size or 0
    if not n_target or abs(n_target - n_draft) > VOCAB_SIZE_SLACK:
        return f"its vocabulary has {n_draft} tokens, the model's {n_target}"
    return None
