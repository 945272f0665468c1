"""Which GGUF of a Hugging Face repository a quant names."""

import pytest

from inference.catalog.pulling.sources import PullError, choose_file

FILES = [
    "Model-Q4_K_M.gguf", "Model-Q4_K_S.gguf", "Model-Q8_0.gguf", "sub/Model-IQ4_XS.gguf",
    "big/Model-Q6_K-00001-of-00002.gguf", "big/Model-Q6_K-00002-of-00002.gguf",
]  # fmt: skip


def test_the_quant_is_matched_as_a_whole_word_without_regard_to_case():
    assert choose_file(FILES, "q8_0", "u/r") == "Model-Q8_0.gguf"
    assert choose_file(FILES, "Q4_K_S", "u/r") == "Model-Q4_K_S.gguf"
    assert choose_file(FILES, "iq4_xs", "u/r") == "sub/Model-IQ4_XS.gguf"


def test_latest_means_q4_k_m():
    assert choose_file(FILES, "latest", "u/r") == "Model-Q4_K_M.gguf"


def test_a_repository_of_one_gguf_has_it_as_its_default():
    assert choose_file(["only.gguf"], "latest", "u/r") == "only.gguf"


def test_a_quant_that_is_only_a_prefix_of_another_is_not_found():
    with pytest.raises(PullError, match="no GGUF file for Q4_K") as refused:
        choose_file(FILES, "Q4_K", "u/r")
    assert refused.value.status == 404 and "Model-Q8_0.gguf" in str(refused.value)


def test_a_split_gguf_is_refused_with_the_reason():
    with pytest.raises(PullError, match="split into parts"):
        choose_file(FILES, "Q6_K", "u/r")


def test_the_mmproj_is_chosen_as_llama_server_chooses_it():
    from inference.catalog.pulling.sources import choose_mmproj

    both = ["mmproj-F16.gguf", "mmproj-Q8_0.gguf"]
    assert choose_mmproj(both, "x.Q4_K_M.gguf") == "mmproj-Q8_0.gguf"  # the closest bits
    assert choose_mmproj(both, "x.BF16.gguf") == "mmproj-F16.gguf"
    nested = ["mmproj-F16.gguf", "vl/mmproj-F32.gguf", "other/mmproj-Q8_0.gguf"]
    assert choose_mmproj(nested, "vl/x.Q8_0.gguf") == "vl/mmproj-F32.gguf"  # its own folder
    assert choose_mmproj(["other/mmproj.gguf"], "x.Q8_0.gguf") is None
    assert choose_mmproj([], "x.Q8_0.gguf") is None
