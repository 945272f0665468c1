"""The fill-in-the-middle prompt of an API request (/infill, Ollama's and OpenAI's `suffix`):
the model's FIM tokens as the catalog read them (LLMModel.fim_tokens), each piece of text
tokenized by the model's own tokenizer in its runner process, and llama-server's layout
(inference.text.infill) over them. A model without the prefix, suffix and middle tokens is
refused with Ollama's words, before anything is tokenized.

Pieces are tokenized without BOS and concurrently (one runner round trip each, answered between
two engine steps); the BOS rule is the tokenizer's own: the BOS is what it adds to an empty
text with add_special. Special tokens' text is parsed as llama-server parses it (infill.Piece):
in `prompt` only, so code that spells a control token (`<|endoftext|>` in a tokenizer's
source, `<|fim_prefix|>` in a file about FIM) reads as plain characters, as it does there, and
cannot inject a control token into the prompt.
"""

import asyncio
from collections.abc import Awaitable, Callable

from dashboard.api.errors import ApiError
from inference.models import LLMModel
from inference.serving.tokens import TokenResult
from inference.text.infill import FimVocab, InfillText, layout, pieces
from inference.text.prompting import Prompt

# The model's tokens of a text (dashboard.api.pipeline.tokenize_text).
Tokenize = Callable[..., Awaitable[TokenResult]]

# The context a layout assumes for a model whose n_ctx is automatic (sized where it loads, so
# unknown here): it only bounds how much of input_extra is kept (inference.text.infill, step 3).
AUTOMATIC_CTX = 4096


def check_insert(model: LLMModel, asked: str) -> None:
    """Ollama's 400 for a model without FIM tokens (its CheckCapabilities: `%q does not support
    insert`), naming the model as asked."""
    if not model.fills_in_middle:
        raise ApiError(400, f'"{asked or model.name}" does not support insert', param="suffix",
                       code="insert_not_supported")  # fmt: skip


def context_per_sequence(model: LLMModel) -> int:
    return model.weights.n_ctx or AUTOMATIC_CTX


async def infill_prompt(model: LLMModel, text: InfillText, tokenize: Tokenize, *,
                        spm: bool = False) -> Prompt:  # fmt: skip
    """The token ids of `text`'s FIM prompt for `model` (check_insert first)."""
    fim = model.fim_tokens
    wanted = pieces(text, _vocab(fim, bos=None))
    results = await asyncio.gather(
        tokenize(model, "", add_special=True),
        *(tokenize(model, piece.text, add_special=False, parse_special=piece.parse_special)
          for piece in wanted),
    )
    bos_id = (model.weights.metadata or {}).get("bos_token_id")
    empty = results[0].tokens
    vocab = _vocab(fim, bos=bos_id if empty and empty[0] == bos_id else None)
    tokens = {piece: result.tokens for piece, result in zip(wanted, results[1:], strict=True)}
    ids = layout(text, vocab, tokens, n_batch=model.weights.n_batch,
                 n_ctx=context_per_sequence(model), spm=spm)  # fmt: skip
    return Prompt("", False, tokens=tuple(ids))


def _vocab(fim: dict, *, bos: int | None) -> FimVocab:
    def role(name: str) -> int | None:
        return fim[name]["id"] if name in fim else None

    return FimVocab(pre=fim["pre"]["id"], suf=fim["suf"]["id"], mid=fim["mid"]["id"],
                    rep=role("rep"), sep=role("sep"), bos=bos)  # fmt: skip
