"""Tokenizing and detokenizing through a loaded model's own vocabulary (llama-server's /tokenize
and /detokenize, count_tokens), so a count is exactly what a generation on the same text sees.

1. A request is checked at once, on the caller's thread (InvalidParams naming the field): a
   text of at most MAX_TEXT_CHARS characters; at most MAX_TOKENS ids, each in [0, n_vocab).
2. The runner is called on the engine thread, between steps (Engine.on_engine_thread), as every
   other llama.cpp call of a serving engine is; the Future's result is a Tokens or a str.
3. A prompt with images (count_tokens of a conversation with pictures) is read as a request's
   is, on the encoder thread (vision.Encoder.count: each picture decoded in the runner's
   decoder process, the prompt split by libmtmd), and never encoded: its ids hold each image's
   positions as pseudo ids (negative), so their number is the prompt tokens a generation of the
   same prompt reports.
"""

from concurrent.futures import Future
from dataclasses import dataclass

from inference.engine.generation import MAX_IMAGES
from inference.engine.media import MEDIA_MARKER, Image
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


def check_images(text: str, images: tuple, *, with_pieces: bool, parse_special: bool) -> None:
    """What a prompt with images to count must be (as GenerationRequest checks a request's)."""
    if with_pieces:
        raise InvalidParams("with_pieces", "an image's positions have no pieces")
    if not parse_special:
        raise InvalidParams("parse_special", "a prompt with images is read as a request's is, "
                            "its special tokens parsed")  # fmt: skip
    if len(images) > MAX_IMAGES or not all(isinstance(image, Image) for image in images):
        raise InvalidParams("images", f"at most {MAX_IMAGES} Images")
    if text.count(MEDIA_MARKER) != len(images):
        raise InvalidParams("images", "a prompt with images holds one media marker per image")


def tokenize(engine, text: str, *, add_special: bool = True, parse_special: bool = True,
             with_pieces: bool = False, images: tuple[Image, ...] = ()) -> Future:  # fmt: skip
    """The ids of `text` (with the model's BOS/EOS as its tokenizer adds them when
    `add_special`). Special tokens written in the text are parsed, as in a prompt, unless
    `parse_special` is false: then "<|endoftext|>" is plain characters, as llama-server reads
    the code of /infill. With `images`, those of the prompt with its images (rule 3)."""
    check_text(text)
    if images:
        check_images(text, images, with_pieces=with_pieces, parse_special=parse_special)
        return engine.count_images(text, tuple(images), add_special)
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
