"""The catalog finds the fill-in-the-middle tokens llama.cpp finds: the header's ids, else the
tokens it knows by their text, so that "insert" is listed for exactly the models llama.cpp can
lay a FIM prompt out for."""

import llama_cpp
import pytest

from inference.gguf.fim_tokens import FimToken, by_text, header_ids
from inference.gguf.reader import read_gguf
from tests.code_model import FIM_IDS, REPO_ID

ROLES = ("pre", "suf", "mid", "pad", "rep", "sep")


def llama_cpp_fim_ids(path) -> dict[str, int]:
    model = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    vocab = llama_cpp.llama_model_get_vocab(model.model)
    found = {role: getattr(llama_cpp, f"llama_vocab_fim_{role}")(vocab) for role in ROLES}
    model.close()
    return {role: token for role, token in found.items() if token != llama_cpp.LLAMA_TOKEN_NULL}


@pytest.mark.parametrize("which", ["starter", "code model"])
def test_the_reader_finds_the_fim_tokens_llama_cpp_finds(which, starter_path, code_model_path):
    path = starter_path if which == "starter" else code_model_path
    found = read_gguf(path).fim
    assert {role: token.id for role, token in found.items()} == llama_cpp_fim_ids(path)


def test_the_code_model_fills_in_the_middle_and_the_starter_does_not(starter_path,
                                                                      code_model_path):
    code = read_gguf(code_model_path)
    assert code.fills_in_middle
    assert code.fim["pre"] == FimToken(FIM_IDS["fim_pre"], "<issue_start>")
    assert code.fim["rep"] == FimToken(REPO_ID, "<reponame>")  # found by its text
    starter = read_gguf(starter_path)
    assert not starter.fills_in_middle
    assert set(starter.fim) == {"rep"}


def test_a_header_id_past_the_vocabulary_is_ignored_as_llama_cpp_ignores_it():
    metadata = {"tokenizer.ggml.fim_pre_token_id": 100, "tokenizer.ggml.fim_suf_token_id": 3}
    assert header_ids(metadata, n_tokens=10) == {"suf": 3}


def test_the_deprecated_keys_win_as_llama_cpp_reads_them_last():
    metadata = {"tokenizer.ggml.fim_pre_token_id": 1, "tokenizer.ggml.prefix_token_id": 2}
    assert header_ids(metadata, n_tokens=10) == {"pre": 2}


def test_the_lowest_id_of_a_known_text_serves_its_role():
    assert by_text({"<PRE>": 7, "<|fim_prefix|>": 3, "<|fim_middle|>": 9}) == {"pre": 3, "mid": 9}
