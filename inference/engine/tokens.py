"""Tokenizing and detokenizing through a loaded model's own vocabulary (llama-server's /tokenize
and /detokenize, count_tokens), so a count is exactly what a generation on the same text sees.

1. A request is checked at once, on the caller's thread (InvalidParams naming the field): a
   text of at most MAX_TEXT_CHARS characters; at most MAX_TOKENS ids, each in [0, n_vocab).
2. The runner is called on the engine thread, between steps (Engine.on_engine_thread), as every
   other llama.cpp call of a serving engine is; the Future's result is a Tokens or a str.
"""

from concurrent.futures import Future
from dataclasses import dataclass

from inference.engine.params import InvalidParams

MAX_TEXT_CHARS = 1_000_000  # a whole conversation's prompt (dashboard.api.bodies agrees)
MAX_TOKENS = 1 << 20


@dataclass(slots=True, frozen=True)
class Tokens:
    ids: tuple[int, ...]
    pieces: tuple[bytes, ...] | None = None  # each id's bytes (special ones written out)


def check_text(text: str) -> None:
    if not isinstance(text, str):
        raise InvalidParams("content", "must be a string")
    if len(text) > MAX_TEXT_CHARS:
        raise InvalidParams("content", f"at most {MAX_TEXT_CHARS} characters, got {len(text)}")


def check_ids(ids: list[int], n_vocab: int) -> None:
    if len(ids) > MAX_TOKENS:
        raise InvalidParams("tokens", f"at most {MAX_TOKENS} tokens, got {len(ids)}")
    for at, token in enumerate(ids):
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < n_vocab:
            raise InvalidParams("tokens", f"tokens[{at}]: {token!r} is not a token id of this "
                                f"model's vocabulary (0 to {n_vocab - 1})")  # fmt: skip


def tokenize(engine, text: str, *, add_special: bool = True, parse_special: bool = True,
             with_pieces: bool = False) -> Future:  # fmt: skip
    """The ids of `text` (with the model's BOS/EOS as its tokenizer adds them when
    `add_special`). Special tokens written in the text are parsed, as in a prompt, unless
    `parse_special` is false: then "<|endoftext|>" is plain characters, as llama-server reads
    the code of /infill."""
    check_text(text)
    runner = engine.runner

    def compute() -> Tokens:
        ids = tuple(runner.tokenize(text, add_special, parse_special))
        return Tokens(ids, tuple(runner.special_piece(t) for t in ids) if with_pieces else None)

    return engine.on_engine_thread(compute)


def detokenize(engine, ids: list[int]) -> Future:
    """The text of `ids`: their pieces joined (special tokens written out, as llama-server
    does), invalid UTF-8 replaced."""
    runner = engine.runner
    check_ids(ids, runner.n_vocab)
    ids = list(ids)

    def compute() -> str:
        return b"".join(runner.special_piece(t) for t in ids).decode("utf-8", errors="replace")

    return engine.on_engine_thread(compute)
