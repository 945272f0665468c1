"""The /infill layout is llama-server's, token for token (tools/server/server-common.cpp,
format_prompt_infill): the repo and file separators around input_extra, the snippet separator
without them, the BOS, the SPM order, and the truncation of prefix, suffix and extra by n_batch
and n_ctx. Each text's ids here are made up, distinct per text, so a piece out of place shows."""

from inference.text.infill import (
    CHUNK_SEPARATOR,
    FILE_LINE,
    REPO_LINE,
    ExtraChunk,
    FimVocab,
    InfillText,
    Piece,
    layout,
    pieces,
)

PRE, SUF, MID, REP, SEP, BOS = 1001, 1002, 1003, 1004, 1005, 1006
FULL = FimVocab(pre=PRE, suf=SUF, mid=MID, rep=REP, sep=SEP)
BARE = FimVocab(pre=PRE, suf=SUF, mid=MID)


def ids_of(text: InfillText, vocab: FimVocab, lengths: dict[str, int] | None = None) -> dict:
    """Made-up ids: the n-th piece's tokens are n*100, n*100+1, ... (its length: `lengths` by
    its text, else 2), found by the piece or, for the code and fixed lines, by their text."""
    ids = {piece: [n * 100 + i for i in range((lengths or {}).get(piece.text, 2))]
           for n, piece in enumerate(pieces(text, vocab), start=1)}  # fmt: skip
    return ids | {piece.text: tokens for piece, tokens in ids.items() if not piece.parse_special}


def typed(text: str) -> Piece:
    """The `prompt` piece: its special tokens' text is parsed."""
    return Piece(text, parse_special=True)


def test_without_extra_the_prompt_is_prefix_then_suffix_then_middle():
    text = InfillText("def f(", "):\n", prompt="x")
    tokens = ids_of(text, BARE)
    assert layout(text, BARE, tokens, n_batch=512, n_ctx=4096) == [
        PRE, *tokens["def f("], *tokens[typed("x")], SUF, *tokens["):\n"], MID]  # fmt: skip


def test_the_repo_and_file_separators_frame_the_extra_chunks():
    text = InfillText("a", "b", extra=(ExtraChunk("one", "x.py"), ExtraChunk("two")))
    t = ids_of(text, FULL)
    assert layout(text, FULL, t, n_batch=512, n_ctx=4096) == [
        REP, *t[REPO_LINE], SEP, *t["x.py\n"], *t["one"], SEP, *t["tmp\n"], *t["two"],
        SEP, *t[FILE_LINE], PRE, *t["a"], *t[typed("")], SUF, *t["b"], MID]  # fmt: skip


def test_the_file_line_is_there_even_without_extra_when_the_vocabulary_has_a_separator():
    text = InfillText("a", "b")
    t = ids_of(text, FULL)
    assert layout(text, FULL, t, n_batch=512, n_ctx=4096) == [
        REP, *t[REPO_LINE], SEP, *t[FILE_LINE], PRE, *t["a"], *t[typed("")], SUF, *t["b"], MID,
    ]  # fmt: skip


def test_without_a_file_separator_chunks_are_split_by_the_snippet_line():
    text = InfillText("a", "b", extra=(ExtraChunk("one"),))
    t = ids_of(text, BARE)
    assert layout(text, BARE, t, n_batch=512, n_ctx=4096)[:4] == [*t[CHUNK_SEPARATOR], *t["one"]]


def test_the_bos_goes_after_the_extra_and_before_the_prefix():
    vocab = FimVocab(pre=PRE, suf=SUF, mid=MID, rep=REP, bos=BOS)
    text = InfillText("a", "b")
    t = ids_of(text, vocab)
    assert layout(text, vocab, t, n_batch=512, n_ctx=4096)[:5] == [REP, *t[REPO_LINE], BOS, PRE]


def test_spm_order_puts_the_suffix_first():
    text = InfillText("a", "b", prompt="p")
    t = ids_of(text, BARE)
    assert layout(text, BARE, t, n_batch=512, n_ctx=4096, spm=True) == [
        SUF, *t["b"], PRE, *t["a"], *t[typed("p")], MID]  # fmt: skip


def test_the_prefix_keeps_its_last_three_quarters_of_a_batch_and_the_suffix_its_start():
    text = InfillText("long prefix", "long suffix", prompt="p")
    t = ids_of(text, BARE, {"long prefix": 100, "long suffix": 100, "p": 3})
    out = layout(text, BARE, t, n_batch=64, n_ctx=4096)
    # 3*(64/4) = 48 prefix tokens, the last ones; 64/4 - (2 + 3) = 11 suffix tokens, the first.
    assert out == [PRE, *t["long prefix"][-48:], *t[typed("p")], SUF, *t["long suffix"][:11], MID]


def test_a_long_prompt_leaves_no_room_for_the_suffix():
    text = InfillText("a", "b", prompt="p")
    t = ids_of(text, BARE, {"p": 20})
    assert layout(text, BARE, t, n_batch=64, n_ctx=4096) == [PRE, *t["a"], *t[typed("p")], SUF, MID]


def test_the_extra_keeps_its_end_within_the_context_less_a_batch():
    text = InfillText("a", "b", extra=(ExtraChunk("old", "o"), ExtraChunk("new", "n")))
    t = ids_of(text, FULL, {"old": 50, "new": 50})
    # n_ctx - n_batch - 2*n_predict = 100 - 64 + 2 = 38 tokens of the extra, its last ones.
    out = layout(text, FULL, t, n_batch=64, n_ctx=100)
    whole = [REP, *t[REPO_LINE], SEP, *t["o\n"], *t["old"], SEP, *t["n\n"], *t["new"],
             SEP, *t[FILE_LINE]]  # fmt: skip
    assert out[:38] == whole[-38:]
    assert out[38] == PRE


def test_only_the_prompt_parses_special_tokens_text_as_llama_server_does():
    # llama-server tokenizes `prompt` with parse_special, the code and its file names without,
    # so the same text is two pieces when it is both the prefix and the prompt.
    spelled = "<|fim_prefix|>"
    text = InfillText(spelled, "b", prompt=spelled, extra=(ExtraChunk("<|endoftext|>", "<f>"),))
    wanted = pieces(text, FULL)
    assert [piece for piece in wanted if piece.parse_special] == [typed(spelled)]
    assert {Piece(spelled), Piece("<|endoftext|>"), Piece("<f>\n")} <= set(wanted)
    t = ids_of(text, FULL)
    assert t[Piece(spelled)] != t[typed(spelled)]
    assert layout(text, FULL, t, n_batch=512, n_ctx=4096)[-9:] == [
        PRE, *t[Piece(spelled)], *t[typed(spelled)], SUF, *t["b"], MID]  # fmt: skip
