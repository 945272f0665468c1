"""Which tokens of a vocabulary fill in the middle, as llama.cpp finds them (src/llama-vocab.cpp,
`llama_vocab::impl::load`): the header's `tokenizer.ggml.fim_*_token_id` where it names a token
of the vocabulary, otherwise the first token whose text is one of the texts below.

A model whose vocabulary has the prefix, suffix and middle tokens can fill in the middle
(Ollama's capability "insert"); the repo and file separators and the pad token, where present,
shape llama-server's /infill prompt (inference.text.infill).
"""

from dataclasses import dataclass

# The roles, in llama.cpp's names (llama_vocab_fim_pre, ...).
ROLES = ("pre", "suf", "mid", "pad", "rep", "sep")
REQUIRED = ("pre", "suf", "mid")

# The texts llama.cpp recognises when the header names no id (Qwen, Granite, DeepSeek, CodeLlama,
# GLM-4.5, Falcon-H1-Tiny-Coder, Kimi-K2), in its order.
TEXTS: dict[str, tuple[str, ...]] = {
    "pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
            "▁<PRE>", "<|code_prefix|>", "<|prefix|>"),
    "suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
            "▁<SUF>", "<|code_suffix|>", "<|suffix|>"),
    "mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
            "▁<MID>", "<|code_middle|>", "<|middle|>"),
    "pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "sep": ("<|file_sep|>",),
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class FimToken:
    id: int
    text: str


# Older files name the first three with these keys; llama.cpp reads them after the fim_ ones.
DEPRECATED_KEYS = {"pre": "tokenizer.ggml.prefix_token_id",
                   "suf": "tokenizer.ggml.suffix_token_id",
                   "mid": "tokenizer.ggml.middle_token_id"}  # fmt: skip


def keys(role: str) -> tuple[str, ...]:
    """The header keys of a role, in the order llama.cpp reads them (the last valid one wins)."""
    deprecated = (DEPRECATED_KEYS[role],) if role in DEPRECATED_KEYS else ()
    return (f"tokenizer.ggml.fim_{role}_token_id", *deprecated)


def all_texts() -> frozenset[str]:
    return frozenset(text for texts in TEXTS.values() for text in texts)


def header_ids(metadata: dict, n_tokens: int) -> dict[str, int]:
    """The roles whose id the header sets to a token of the vocabulary (llama.cpp ignores an id
    past its end, with a warning)."""
    found = {}
    for role in ROLES:
        for name in keys(role):
            value = metadata.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < n_tokens:
                found[role] = value
    return found


def by_text(found_texts: dict[str, int]) -> dict[str, int]:
    """For each role, the id of the vocabulary's first token (lowest id) with one of its texts;
    `found_texts`: each recognised text in the vocabulary and its lowest id."""
    ids = {}
    for role, texts in TEXTS.items():
        matches = [found_texts[text] for text in texts if text in found_texts]
        if matches:
            ids[role] = min(matches)
    return ids


def fills_in_middle(tokens: dict[str, FimToken]) -> bool:
    return all(role in tokens for role in REQUIRED)


def as_record(tokens: dict[str, FimToken]) -> dict[str, dict]:
    """The tokens as the catalog stores them (LLMModel.metadata["fim"], read back by
    LLMModel.fim_tokens): role → {"id", "text"}."""
    return {role: {"id": token.id, "text": token.text} for role, token in tokens.items()}
