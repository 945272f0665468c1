"""Damaged GGUF files: each is refused with a GGUFError that names the problem.

Offsets are found in the bytes of the file we wrote: a key or tensor name is searched for, and
the fields after it follow the layout (a key: u32 type, value; a tensor name: u32 n_dims,
u64 dims, u32 type, u64 offset).
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from inference.gguf import GGUFError, read_gguf
from inference.gguf import reader as gguf_reader


def patched(path: Path, offset: int, new: bytes) -> Path:
    data = bytearray(path.read_bytes())
    data[offset : offset + len(new)] = new
    path.write_bytes(bytes(data))
    return path


def truncated(path: Path, length: int) -> Path:
    path.write_bytes(path.read_bytes()[:length])
    return path


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def u64(n: int) -> bytes:
    return struct.pack("<Q", n)


def key_at(path: Path, key: str) -> int:
    """Offset of a metadata key's bytes (its u64 length is the 8 bytes before)."""
    return path.read_bytes().index(key.encode())


def value_type_at(path: Path, key: str) -> int:
    return key_at(path, key) + len(key)


def tensor_fields(path: Path, name: str) -> dict[str, int]:
    """Offsets of a tensor info's fields."""
    data = path.read_bytes()
    at = data.index(name.encode()) + len(name)
    (n_dims,) = struct.unpack_from("<I", data, at)
    dims = at + 4
    type_at = dims + 8 * n_dims
    return {"n_dims": at, "dims": dims, "type": type_at, "offset": type_at + 4}


def tensor_offset(path: Path, name: str) -> int:
    return struct.unpack_from("<Q", path.read_bytes(), tensor_fields(path, name)["offset"])[0]


def refused(path: Path, match: str) -> str:
    with pytest.raises(GGUFError, match=match) as excinfo:
        read_gguf(path)
    return str(excinfo.value)


# 1. Truncation.


def test_it_refuses_an_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.gguf"
    path.write_bytes(b"")
    refused(path, "shorter than the 24-byte header")


def test_it_refuses_a_truncated_header(tiny_gguf: Path) -> None:
    refused(truncated(tiny_gguf, 10), "shorter than the 24-byte header")


def test_it_refuses_a_file_truncated_in_the_metadata(tiny_gguf: Path) -> None:
    cut = key_at(tiny_gguf, "tokenizer.chat_template") + 40
    refused(truncated(tiny_gguf, cut), "truncated")


def test_it_refuses_a_file_truncated_in_the_tensor_infos(tiny_gguf: Path) -> None:
    cut = tiny_gguf.read_bytes().index(b"blk.1.attn_q.weight") + 5
    refused(truncated(tiny_gguf, cut), "truncated")


def test_it_refuses_a_file_truncated_in_the_tensor_data(tiny_gguf: Path) -> None:
    info = read_gguf(tiny_gguf)
    message = refused(truncated(tiny_gguf, info.data_offset + 100), "runs past the end of the file")
    assert "'token_embd.weight'" in message and f"({info.data_offset + 100} bytes)" in message


def test_it_refuses_a_file_that_ends_before_its_data_section(tiny_gguf: Path) -> None:
    fields = tensor_fields(tiny_gguf, "output_norm.weight")
    refused(truncated(tiny_gguf, fields["offset"] + 8), "past the end")


# 2. The header.


def test_it_refuses_a_bad_magic(tiny_gguf: Path) -> None:
    refused(patched(tiny_gguf, 0, b"GGML"), "bad magic b'GGML'")


@pytest.mark.parametrize("version", [1, 99])
def test_it_refuses_unsupported_versions(tiny_gguf: Path, version: int) -> None:
    refused(patched(tiny_gguf, 4, u32(version)), f"unsupported GGUF version {version}")


def test_it_refuses_an_absurd_tensor_count(tiny_gguf: Path) -> None:
    refused(patched(tiny_gguf, 8, u64(2**40)), "tensor count 1099511627776 .* over the limit")


def test_it_refuses_an_absurd_metadata_count(tiny_gguf: Path) -> None:
    refused(patched(tiny_gguf, 16, u64(2**62)), "metadata count .* over the limit")


def test_it_refuses_counts_that_cannot_fit_in_the_file(tiny_gguf: Path) -> None:
    refused(patched(tiny_gguf, 8, u64(60_000)), "tensor count 60000 need at least")


# 3. Metadata.


def test_it_refuses_a_string_length_of_two_to_the_63(tiny_gguf: Path) -> None:
    # The first key's length is at offset 24, right after the header.
    refused(patched(tiny_gguf, 24, u64(2**63)), "string length 9223372036854775808 is over")


def test_it_refuses_an_unknown_value_type(tiny_gguf: Path) -> None:
    at = value_type_at(tiny_gguf, "general.name")
    refused(patched(tiny_gguf, at, u32(13)), "'general.name': unknown value type 13")


def test_it_refuses_an_array_longer_than_the_cap(tiny_gguf: Path) -> None:
    length_at = value_type_at(tiny_gguf, "tokenizer.ggml.tokens") + 4 + 4
    refused(patched(tiny_gguf, length_at, u64(2**30)), "length 1073741824 is over the limit")


def test_it_refuses_an_array_longer_than_the_file(tiny_gguf: Path) -> None:
    length_at = value_type_at(tiny_gguf, "tokenizer.ggml.tokens") + 4 + 4
    refused(patched(tiny_gguf, length_at, u64(2**20)), "array of 1048576 string elements")


def test_it_refuses_arrays_nested_too_deep(make_gguf) -> None:
    path = make_gguf(extra=lambda w: w.add_array("test.deep", [[[[1]]]]))
    refused(path, "'test.deep'.*nested deeper")


def test_it_accepts_arrays_nested_three_deep(make_gguf) -> None:
    path = make_gguf(extra=lambda w: w.add_array("test.deep", [[[1]]]))
    assert read_gguf(path).metadata["test.deep"] == [[[1]]]


def test_it_refuses_a_duplicate_key(make_gguf) -> None:
    def two_keys(w) -> None:
        w.add_uint32("test.aaa", 1)
        w.add_uint32("test.bbb", 2)

    path = make_gguf(extra=two_keys)
    refused(patched(path, key_at(path, "test.bbb"), b"test.aaa"), "'test.aaa': duplicate key")


def test_it_refuses_a_key_that_is_not_utf8(tiny_gguf: Path) -> None:
    refused(patched(tiny_gguf, key_at(tiny_gguf, "general.name"), b"\xff"), "not valid UTF-8")


def test_it_refuses_an_alignment_that_is_not_a_power_of_two(make_gguf) -> None:
    path = make_gguf(alignment=64)
    at = value_type_at(path, "general.alignment") + 4
    refused(patched(path, at, u32(48)), "alignment 48 is not a power of two")


def test_it_refuses_metadata_over_the_size_cap(tiny_gguf: Path, monkeypatch) -> None:
    monkeypatch.setattr(gguf_reader, "MAX_METADATA_BYTES", 200)
    refused(tiny_gguf, "limit on metadata")


# 4. Tensor infos and data.


def test_it_refuses_a_tensor_offset_past_the_end(tiny_gguf: Path) -> None:
    at = tensor_fields(tiny_gguf, "output_norm.weight")["offset"]
    message = refused(patched(tiny_gguf, at, u64(2**40)), "runs past the end of the file")
    assert "'output_norm.weight'" in message


def test_it_refuses_overlapping_tensors(tiny_gguf: Path) -> None:
    first = tensor_offset(tiny_gguf, "blk.0.attn_q.weight")
    at = tensor_fields(tiny_gguf, "blk.1.attn_q.weight")["offset"]
    refused(patched(tiny_gguf, at, u64(first + 32)), "overlaps tensor")


def test_it_refuses_a_misaligned_tensor_offset(tiny_gguf: Path) -> None:
    fields = tensor_fields(tiny_gguf, "blk.1.attn_q.weight")
    offset = tensor_offset(tiny_gguf, "blk.1.attn_q.weight")
    message = refused(patched(tiny_gguf, fields["offset"], u64(offset + 1)), "not aligned")
    assert "'blk.1.attn_q.weight'" in message


@pytest.mark.parametrize("n_dims", [0, 9])
def test_it_refuses_a_bad_dimension_count(tiny_gguf: Path, n_dims: int) -> None:
    at = tensor_fields(tiny_gguf, "blk.0.attn_q.weight")["n_dims"]
    refused(patched(tiny_gguf, at, u32(n_dims)), f"has {n_dims} dimensions")


def test_it_refuses_an_unknown_ggml_type(tiny_gguf: Path) -> None:
    at = tensor_fields(tiny_gguf, "blk.0.attn_q.weight")["type"]
    refused(patched(tiny_gguf, at, u32(99)), "'blk.0.attn_q.weight'.*unknown ggml type 99")


def test_it_refuses_dimensions_whose_product_overflows(tiny_gguf: Path) -> None:
    at = tensor_fields(tiny_gguf, "blk.0.attn_q.weight")["dims"]
    refused(patched(tiny_gguf, at, u64(2**40) + u64(2**40)), "overflow")


def test_it_refuses_a_row_that_is_not_whole_blocks(tiny_gguf: Path) -> None:
    at = tensor_fields(tiny_gguf, "blk.0.ffn_down.weight")["dims"]
    refused(patched(tiny_gguf, at, u64(40)), "not a multiple of the Q8_0 block size 32")


def test_it_refuses_a_duplicate_tensor_name(tiny_gguf: Path) -> None:
    at = tiny_gguf.read_bytes().index(b"blk.1.attn_q.weight")
    refused(patched(tiny_gguf, at, b"blk.0"), "'blk.0.attn_q.weight'.*duplicate")


def test_it_refuses_too_many_nested_arrays(make_gguf) -> None:
    path = make_gguf(extra=lambda w: w.add_array("test.many", [[1]] * 70_000))
    refused(path, "'test.many'.*more than 65536 nested arrays")


def test_it_refuses_a_huge_string_inside_a_long_vocabulary(make_gguf) -> None:
    path = make_gguf(n_vocab=5000)
    # The tokens array: u32 type, u32 element type, u64 count, then the first token's length.
    first_length_at = value_type_at(path, "tokenizer.ggml.tokens") + 4 + 4 + 8
    refused(patched(path, first_length_at, u64(2**40)), "string length 1099511627776 is over")


def test_it_refuses_a_file_truncated_inside_a_long_vocabulary(make_gguf) -> None:
    path = make_gguf(n_vocab=5000)
    cut = path.read_bytes().index(b"tok4000")
    refused(truncated(path, cut), "truncated")
