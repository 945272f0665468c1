"""The fill-in-the-middle prompt, token for token as llama-server lays it out for /infill
(tools/server/server-common.cpp, `format_prompt_infill`), so that the same request reads the
same tokens and gives the same temperature-0 answer.

The layout (FIM repo-level pattern, arXiv 2409.12186):

    [FIM_REP]myproject\n                       (where the vocabulary has a repo token)
    [FIM_SEP]{filename}\n{text}                 for each extra chunk (without a file separator
                                                token: "\n\n--- snippet ---\n\n"{text})
    [FIM_SEP]filename\n                         (where it has a file separator token)
    [BOS][FIM_PRE]{prefix}{prompt}[FIM_SUF]{suffix}[FIM_MID]

and in SPM order ([FIM_SUF]{suffix} before [FIM_PRE]{prefix}{prompt}) where asked. Its
truncation, all in tokens:
1. the prefix keeps its last 3·(n_batch/4) tokens;
2. the suffix keeps its first max(0, n_batch/4 − (2 + prompt tokens)) tokens;
3. the extra context (repo line, chunks and the last file line together) keeps its last
   max(0, n_ctx − n_batch − 2·n_predict) tokens, n_predict being the server's (-1: no limit).

Every text is tokenized alone, without BOS (the web side asks the model's own tokenizer for
each piece: `pieces`), and the BOS goes first where the tokenizer adds one. Special tokens'
text is read as llama-server reads it (`Piece`): in `prompt` it is the token, in the code and
llama-server's own lines it is plain characters. This module knows no engine and no HTTP:
pieces in, token ids out.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

# llama-server's fixed texts: its project and file names ("TODO: make project name an input"),
# and the separator of chunks for a vocabulary without a file separator token.
REPO_LINE = "myproject\n"
FILE_LINE = "filename\n"
CHUNK_SEPARATOR = "\n\n--- snippet ---\n\n"
DEFAULT_FILENAME = "tmp"
# The server-wide n_predict of a llama-server started without -n.
SERVER_N_PREDICT = -1


@dataclass(frozen=True, slots=True)
class FimVocab:
    """The vocabulary's FIM token ids (inference.gguf.fim_tokens) and its BOS, where the
    tokenizer adds one (llama_vocab_get_add_bos)."""

    pre: int
    suf: int
    mid: int
    rep: int | None = None
    sep: int | None = None
    bos: int | None = None


@dataclass(frozen=True, slots=True)
class Piece:
    """One text the layout tokenizes alone, and whether special tokens' text in it is parsed.
    llama-server parses it in `prompt` only (tokenize_input_prompts with parse_special); the
    prefix, suffix, extra chunks, their filenames and its fixed lines are plain characters
    (tokenize_mixed and common_tokenize with parse_special false), so a file that spells
    "<|endoftext|>" or a FIM token cannot put that control token into the prompt."""

    text: str
    parse_special: bool = False


@dataclass(frozen=True, slots=True)
class ExtraChunk:
    """Another file's chunk (input_extra's {filename, text})."""

    text: str
    filename: str = DEFAULT_FILENAME


@dataclass(frozen=True, slots=True)
class InfillText:
    """What an editor sends: the code before and after the cursor, the current line's start
    (`prompt`, llama.vscode's), other files' chunks."""

    prefix: str
    suffix: str
    prompt: str = ""
    extra: tuple[ExtraChunk, ...] = ()


def pieces(text: InfillText, vocab: FimVocab) -> list[Piece]:
    """Every piece the layout tokenizes, each alone (duplicates once): the caller's tokenizer
    maps each to its ids for `layout`."""
    plain = [text.prefix, text.suffix]
    if vocab.rep is not None:
        plain.append(REPO_LINE)
    if vocab.sep is not None:
        plain.append(FILE_LINE)
        plain += [chunk.filename + "\n" for chunk in text.extra]
    elif text.extra:
        plain.append(CHUNK_SEPARATOR)
    plain += [chunk.text for chunk in text.extra]
    wanted = [Piece(text.prompt, parse_special=True), *map(Piece, plain)]
    return list(dict.fromkeys(wanted))


def layout(text: InfillText, vocab: FimVocab, tokens: Mapping[Piece, Sequence[int]], *,
           n_batch: int, n_ctx: int, n_predict: int = SERVER_N_PREDICT,
           spm: bool = False) -> list[int]:  # fmt: skip
    """The prompt's token ids; `tokens`: the ids of each of `pieces(text, vocab)`."""

    def plain(piece: str) -> Sequence[int]:
        return tokens[Piece(piece)]

    # The extra context, whole, before its truncation (step 3).
    extra: list[int] = []
    if vocab.rep is not None:
        extra += [vocab.rep, *plain(REPO_LINE)]
    for chunk in text.extra:
        if vocab.sep is not None:
            extra += [vocab.sep, *plain(chunk.filename + "\n")]
        else:
            extra += plain(CHUNK_SEPARATOR)
        extra += plain(chunk.text)
    if vocab.sep is not None:
        extra += [vocab.sep, *plain(FILE_LINE)]

    prefix, suffix = plain(text.prefix), plain(text.suffix)
    prompt = tokens[Piece(text.prompt, parse_special=True)]
    prefix_take = min(len(prefix), 3 * (n_batch // 4))  # step 1
    suffix_take = min(len(suffix), max(0, n_batch // 4 - (2 + len(prompt))))  # step 2
    extra_take = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra))  # step 3

    before = [vocab.pre, *prefix[len(prefix) - prefix_take:], *prompt]
    after = [vocab.suf, *suffix[:suffix_take]]
    first, second = (after, before) if spm else (before, after)
    bos = [vocab.bos] if vocab.bos is not None else []
    return [*extra[len(extra) - extra_take:], *bos, *first, *second, vocab.mid]
