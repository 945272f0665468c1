"""Reading valid GGUF files: tiny ones written here, and the real starter model."""

from __future__ import annotations

from pathlib import Path

import gguf
import pytest

from inference.gguf import (
    FILE_TYPES,
    GGML_TYPES,
    ArraySummary,
    GGUFError,
    GGUFInfo,
    read_gguf,
)
from inference.gguf.reader import KEEP_ARRAY_ELEMENTS


def test_it_reads_every_derived_field_of_a_tiny_model(tiny_gguf: Path, tiny) -> None:
    info = read_gguf(tiny_gguf)

    assert isinstance(info, GGUFInfo)
    assert info.version == 3
    assert info.architecture == "llama"
    assert info.name == "tiny"
    assert info.license == "mit"
    assert info.context_length == tiny.context
    assert info.block_count == info.layer_count == tiny.layers
    assert info.embedding_length == tiny.embed
    assert info.head_count == tiny.heads
    assert info.head_count_kv == tiny.heads_kv
    assert info.key_length is None and info.value_length is None
    assert info.chat_template == tiny.template
    assert info.tokenizer_model == "gpt2"
    assert info.vocab_size == 16
    assert (info.bos_token_id, info.eos_token_id) == (1, 2)
    assert (info.bos_token, info.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert info.file_size == tiny_gguf.stat().st_size
    assert info.data_offset % 32 == 0 and info.alignment == 32


def test_it_lists_the_tensors_with_shapes_types_and_sizes(tiny_gguf: Path, tiny) -> None:
    info = read_gguf(tiny_gguf)

    expected = tiny.tensors(16)
    assert info.tensor_count == len(expected)
    assert [(t.name, t.shape, t.type_name, t.nbytes) for t in info.tensors] == expected
    assert info.parameter_count == sum(_product(shape) for _, shape, _, _ in expected)
    assert info.weights_bytes == sum(nbytes for *_, nbytes in expected)
    for t in info.tensors:
        assert t.offset % info.alignment == 0
        assert info.data_offset + t.offset + t.nbytes <= info.file_size


def test_it_agrees_with_the_gguf_package_on_tensor_offsets(tiny_gguf: Path) -> None:
    ours = read_gguf(tiny_gguf)
    theirs = gguf.GGUFReader(tiny_gguf)

    assert [(t.name, ours.data_offset + t.offset, t.nbytes) for t in ours.tensors] == [
        (t.name, int(t.data_offset), int(t.n_bytes)) for t in theirs.tensors
    ]


def test_it_names_the_quantisation_after_general_file_type(make_gguf) -> None:
    assert read_gguf(make_gguf(file_type=15)).quantization == "Q4_K_M"
    assert read_gguf(make_gguf("f16.gguf", file_type=1)).quantization == "F16"


def test_without_a_file_type_the_quantisation_is_the_type_holding_most_bytes(make_gguf) -> None:
    # 16 x 64 F16 = 2 kB, against 2 x 16 kB of F32 attention weights.
    assert read_gguf(make_gguf(n_vocab=16)).quantization == "F32"
    # 1024 x 64 F16 = 128 kB.
    assert read_gguf(make_gguf("big.gguf", n_vocab=1024)).quantization == "F16"


def test_it_takes_the_largest_of_per_layer_kv_head_counts(make_gguf) -> None:
    info = read_gguf(make_gguf(head_count_kv=[1, 4]))

    assert info.metadata["llama.attention.head_count_kv"] == [1, 4]
    assert info.head_count_kv == 4


def test_it_summarises_a_long_vocabulary_and_still_finds_bos_and_eos(make_gguf) -> None:
    info = read_gguf(make_gguf(n_vocab=KEEP_ARRAY_ELEMENTS + 1000))

    tokens = info.metadata["tokenizer.ggml.tokens"]
    assert tokens == ArraySummary("string", KEEP_ARRAY_ELEMENTS + 1000)
    assert info.vocab_size == KEEP_ARRAY_ELEMENTS + 1000
    assert (info.bos_token, info.eos_token) == ("<|im_start|>", "<|im_end|>")


def test_it_reads_every_metadata_value_type(make_gguf) -> None:
    def add_values(w: gguf.GGUFWriter) -> None:
        w.add_uint8("t.u8", 250)
        w.add_int8("t.i8", -5)
        w.add_uint16("t.u16", 65000)
        w.add_int16("t.i16", -300)
        w.add_int32("t.i32", -70000)
        w.add_float32("t.f32", 0.5)
        w.add_uint64("t.u64", 2**40)
        w.add_int64("t.i64", -(2**40))
        w.add_float64("t.f64", 0.25)
        w.add_bool("t.bool", True)
        w.add_array("t.nested", [[1, 2], [3]])
        w.add_array("t.strings", ["a", "é"])

    meta = read_gguf(make_gguf(extra=add_values)).metadata

    assert (meta["t.u8"], meta["t.i8"], meta["t.u16"], meta["t.i16"]) == (250, -5, 65000, -300)
    assert (meta["t.i32"], meta["t.f32"], meta["t.u64"], meta["t.i64"]) == (
        -70000, 0.5, 2**40, -(2**40),
    )  # fmt: skip
    assert (meta["t.f64"], meta["t.bool"]) == (0.25, True)
    assert meta["t.nested"] == [[1, 2], [3]]
    assert meta["t.strings"] == ["a", "é"]


def test_it_honours_a_custom_alignment(make_gguf) -> None:
    info = read_gguf(make_gguf(alignment=256))

    assert info.alignment == 256
    assert info.data_offset % 256 == 0
    assert all(t.offset % 256 == 0 for t in info.tensors)


def test_a_model_without_a_chat_template_says_none(make_gguf) -> None:
    assert read_gguf(make_gguf(chat_template=None)).chat_template is None


def test_it_refuses_a_missing_file_with_a_gguf_error(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="cannot read"):
        read_gguf(tmp_path / "nothing.gguf")


def test_its_type_table_matches_ggml(tiny_gguf: Path) -> None:
    # Every type ggml knows (via the gguf package's table) has the same block and type size.
    for qtype, (block_size, type_size) in gguf.GGML_QUANT_SIZES.items():
        ours = GGML_TYPES.get(int(qtype))
        if ours is None:  # a type newer than our table: files using it are refused, not misread
            continue
        assert (ours.name, ours.block_size, ours.type_size) == (qtype.name, block_size, type_size)


def test_its_file_type_names_match_llama_cpp() -> None:
    for ftype in gguf.LlamaFileType:
        if ftype.value in FILE_TYPES:
            assert FILE_TYPES[ftype.value] == ftype.name.removeprefix("MOSTLY_").removeprefix(
                "ALL_"
            )


def test_it_reads_the_starter_model(starter_model: Path) -> None:
    info = read_gguf(starter_model)

    assert info.architecture == "llama"
    assert 130_000_000 < info.parameter_count < 140_000_000
    assert info.metadata["general.file_type"] == 3
    assert info.quantization == "Q4_1"
    assert info.context_length == 8192
    assert info.block_count == 30
    assert (info.embedding_length, info.head_count, info.head_count_kv) == (576, 9, 3)
    assert info.tokenizer_model == "gpt2"
    assert info.vocab_size == 49152
    assert info.license == "apache-2.0"
    assert "<|im_start|>" in (info.chat_template or "")
    assert (info.bos_token, info.eos_token) == ("<|im_start|>", "<|im_end|>")
    assert info.weights_bytes < info.file_size
    assert isinstance(info.metadata["tokenizer.ggml.merges"], ArraySummary)


def test_it_agrees_with_the_gguf_package_on_the_starter_model(starter_model: Path) -> None:
    ours = read_gguf(starter_model)
    theirs = gguf.GGUFReader(starter_model)

    assert [(t.name, t.shape, ours.data_offset + t.offset, t.nbytes) for t in ours.tensors] == [
        (t.name, tuple(int(d) for d in t.shape), int(t.data_offset), int(t.n_bytes))
        for t in theirs.tensors
    ]


def _product(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
