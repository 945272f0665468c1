"""A validating, read-only GGUF reader (v2 and v3, little-endian).

Model files come from the LAN and from strangers, so nothing in one is trusted: every count,
length, offset and size is checked against the file's real size (and against fixed caps) before
anything is read or allocated. Only the header region is read; tensor data is never touched,
so a multi-GB model costs a few MB of reads. Any problem is a `GGUFError` naming what is wrong
and where; no other exception type escapes `read_gguf`.

Layout (all integers little-endian):
    magic b"GGUF", u32 version, u64 tensor_count, u64 metadata_kv_count,
    metadata: (string key, u32 value type, value) * kv_count,
    tensor infos: (string name, u32 n_dims, u64 dims[n_dims], u32 ggml type, u64 offset) * n,
    padding to general.alignment (default 32), then the tensor data (offsets are relative to it).
A string is a u64 byte length followed by UTF-8 bytes; an array is a u32 element type, a u64
count, then the elements.
"""

from __future__ import annotations

import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from inference.gguf import fim_tokens
from inference.gguf.fim_tokens import FimToken


class GGUFError(ValueError):
    """The file is not a GGUF file we accept; the message says what is wrong and where, and
    `plain` says it for someone who does not read offsets (the pages show both)."""

    plain = "this file is damaged or is not a model the appliance can read"


class NotGGUF(GGUFError):
    plain = "this file is not a GGUF model (it does not start with the GGUF signature)"


class UnsupportedVersion(GGUFError):
    plain = "this GGUF file has a format version the appliance cannot read (only 2 and 3)"


class Truncated(GGUFError):
    plain = "this file ends too early: it is incomplete (an interrupted copy or download?)"


class Unreadable(GGUFError):
    plain = "the file could not be read (it is missing, or the appliance may not open it)"


GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 65536

# Caps on hostile input. Real models stay far below them: a 250k-token vocabulary is a 250k
# array and ~10 MB of metadata; the biggest models have a few thousand tensors.
MAX_TENSORS = 65536
MAX_KV = 65536
MAX_STRING_BYTES = 1 << 20
MAX_TENSOR_NAME_BYTES = 256  # llama.cpp itself allows 63
MAX_METADATA_BYTES = 64 << 20
MAX_ARRAY_ELEMENTS = 1 << 24
MAX_ARRAY_DEPTH = 3
MAX_NESTED_ARRAYS = 65536  # in the whole file: each costs a Python call, the time must be bounded
MAX_DIMS = 4
INT64_MAX = 2**63 - 1

# Arrays longer than this are summarised (type and length) instead of kept: nobody needs the
# 150k tokenizer merges in memory, and a per-layer array is never this long.
KEEP_ARRAY_ELEMENTS = 4096

_HEADER_BYTES = 4 + 4 + 8 + 8
_WINDOW_BYTES = 1 << 20
_U64 = struct.Struct("<Q")
# The least bytes a metadata entry can take: key length, a 1-byte key, value type, 1-byte value.
_MIN_KV_BYTES = 8 + 1 + 4 + 1
# And a tensor info: name length, a 1-byte name, n_dims, one dimension, type, offset.
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8


@dataclass(frozen=True, slots=True)
class GGMLType:
    name: str
    block_size: int  # elements per block
    type_size: int  # bytes per block


# From ggml (gguf-py's GGMLQuantizationType and GGML_QUANT_SIZES), copied so that reading never
# depends on the gguf package. Ids 4, 5, 31..33 and 36..38 were removed from ggml.
GGML_TYPES: dict[int, GGMLType] = {
    0: GGMLType("F32", 1, 4),
    1: GGMLType("F16", 1, 2),
    2: GGMLType("Q4_0", 32, 18),
    3: GGMLType("Q4_1", 32, 20),
    6: GGMLType("Q5_0", 32, 22),
    7: GGMLType("Q5_1", 32, 24),
    8: GGMLType("Q8_0", 32, 34),
    9: GGMLType("Q8_1", 32, 40),
    10: GGMLType("Q2_K", 256, 84),
    11: GGMLType("Q3_K", 256, 110),
    12: GGMLType("Q4_K", 256, 144),
    13: GGMLType("Q5_K", 256, 176),
    14: GGMLType("Q6_K", 256, 210),
    15: GGMLType("Q8_K", 256, 292),
    16: GGMLType("IQ2_XXS", 256, 66),
    17: GGMLType("IQ2_XS", 256, 74),
    18: GGMLType("IQ3_XXS", 256, 98),
    19: GGMLType("IQ1_S", 256, 50),
    20: GGMLType("IQ4_NL", 32, 18),
    21: GGMLType("IQ3_S", 256, 110),
    22: GGMLType("IQ2_S", 256, 82),
    23: GGMLType("IQ4_XS", 256, 136),
    24: GGMLType("I8", 1, 1),
    25: GGMLType("I16", 1, 2),
    26: GGMLType("I32", 1, 4),
    27: GGMLType("I64", 1, 8),
    28: GGMLType("F64", 1, 8),
    29: GGMLType("IQ1_M", 256, 56),
    30: GGMLType("BF16", 1, 2),
    34: GGMLType("TQ1_0", 256, 54),
    35: GGMLType("TQ2_0", 256, 66),
    39: GGMLType("MXFP4", 32, 17),
    40: GGMLType("NVFP4", 64, 36),
    41: GGMLType("Q1_0", 128, 18),
}
GGML_TYPES_BY_NAME: dict[str, GGMLType] = {t.name: t for t in GGML_TYPES.values()}

# general.file_type (llama.h's llama_ftype) to the name people know the quantisation by.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 4: "Q4_1_SOME_F16", 7: "Q8_0", 8: "Q5_0",
    9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
    16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
    22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M",
    28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0",
    38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0",
}  # fmt: skip

# Metadata value types: id -> (name, struct format, size). Strings (8) and arrays (9) are
# variable-sized and handled apart.
_STRING, _ARRAY = 8, 9
_SCALARS: dict[int, tuple[str, str, int]] = {
    0: ("uint8", "B", 1),
    1: ("int8", "b", 1),
    2: ("uint16", "H", 2),
    3: ("int16", "h", 2),
    4: ("uint32", "I", 4),
    5: ("int32", "i", 4),
    6: ("float32", "f", 4),
    7: ("bool", "?", 1),
    10: ("uint64", "Q", 8),
    11: ("int64", "q", 8),
    12: ("float64", "d", 8),
}


def _type_name(vtype: int) -> str:
    if vtype == _STRING:
        return "string"
    if vtype == _ARRAY:
        return "array"
    return _SCALARS[vtype][0]


@dataclass(frozen=True, slots=True)
class ArraySummary:
    """A long metadata array (a tokenizer vocabulary, merges): its element type and length only."""

    element_type: str
    length: int


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the fastest-varying (row) dimension
    type_name: str
    offset: int  # relative to GGUFInfo.data_offset
    nbytes: int

    @property
    def n_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True, slots=True)
class GGUFInfo:
    path: str
    version: int
    tensor_count: int
    metadata: dict[str, Any]  # long arrays are ArraySummary; short ones are lists
    tensors: tuple[TensorInfo, ...]
    alignment: int
    data_offset: int
    file_size: int
    bos_token: str | None = None  # the text of the BOS/EOS tokens, for chat templates
    eos_token: str | None = None
    # The fill-in-the-middle tokens by role ("pre", "suf", "mid", "pad", "rep", "sep"), as
    # llama.cpp finds them (inference.gguf.fim_tokens); empty for a model without any.
    fim: dict[str, FimToken] = field(default_factory=dict)

    @property
    def fills_in_middle(self) -> bool:
        return fim_tokens.fills_in_middle(self.fim)

    # 1. Identity.

    @property
    def architecture(self) -> str | None:
        return self._str("general.architecture")

    @property
    def name(self) -> str | None:
        return self._str("general.name")

    @property
    def license(self) -> str | None:
        return self._str("general.license")

    @property
    def parameter_count(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def weights_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    @property
    def quantization(self) -> str | None:
        file_type = self._int("general.file_type")
        if file_type is not None and file_type in FILE_TYPES:
            return FILE_TYPES[file_type]
        # No (known) file type: name the file after the type holding most of its bytes.
        by_bytes: Counter[str] = Counter()
        for t in self.tensors:
            by_bytes[t.type_name] += t.nbytes
        return by_bytes.most_common(1)[0][0] if by_bytes else None

    # 2. Shape of the network ({arch}.* keys).

    @property
    def context_length(self) -> int | None:
        return self._arch_int("context_length")

    @property
    def block_count(self) -> int | None:
        return self._arch_int("block_count")

    @property
    def layer_count(self) -> int | None:
        return self.block_count

    @property
    def embedding_length(self) -> int | None:
        return self._arch_int("embedding_length")

    @property
    def head_count(self) -> int | None:
        return self._arch_int("attention.head_count")

    @property
    def head_count_kv(self) -> int | None:
        # Absent means no grouped-query attention: llama.cpp then uses head_count.
        kv = self._arch_int("attention.head_count_kv")
        return kv if kv is not None else self.head_count

    @property
    def key_length(self) -> int | None:
        return self._arch_int("attention.key_length")

    @property
    def value_length(self) -> int | None:
        return self._arch_int("attention.value_length")

    # 3. Tokenizer.

    @property
    def chat_template(self) -> str | None:
        return self._str("tokenizer.chat_template")

    @property
    def tokenizer_model(self) -> str | None:
        return self._str("tokenizer.ggml.model")

    @property
    def vocab_size(self) -> int | None:
        tokens = self.metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, ArraySummary):
            return tokens.length
        if isinstance(tokens, list):
            return len(tokens)
        return self._arch_int("vocab_size")

    @property
    def bos_token_id(self) -> int | None:
        return self._int("tokenizer.ggml.bos_token_id")

    @property
    def eos_token_id(self) -> int | None:
        return self._int("tokenizer.ggml.eos_token_id")

    # Typed lookups: a value of the wrong type reads as absent rather than crashing a caller.

    def _str(self, key: str) -> str | None:
        value = self.metadata.get(key)
        return value if isinstance(value, str) else None

    def _int(self, key: str) -> int | None:
        value = self.metadata.get(key)
        if isinstance(value, list):  # per-layer values: the largest is what sizing needs
            ints = [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
            return max(ints) if ints else None
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def _arch_int(self, suffix: str) -> int | None:
        arch = self.architecture
        return self._int(f"{arch}.{suffix}") if arch else None


def read_gguf(path: str | os.PathLike[str]) -> GGUFInfo:
    """Read and validate a GGUF file's header, metadata and tensor table."""
    try:
        # A large buffer: the tokenizer arrays are ~100k tiny reads.
        with open(path, "rb", buffering=1 << 20) as f:
            file_size = os.fstat(f.fileno()).st_size
            return _parse(f, file_size, os.fspath(path))
    except GGUFError:
        raise
    except OSError as e:
        raise Unreadable(f"cannot read {os.fspath(path)!r}: {e.strerror or e}") from e
    except Exception as e:  # a bug in the checks below; still a refusal, never a crash
        raise GGUFError(f"unexpected error reading {os.fspath(path)!r}: {e!r}") from e


class _Cursor:
    """Bounded reads over a file object: nothing is read past `limit` (the file size or a cap)."""

    def __init__(self, f: BinaryIO, file_size: int) -> None:
        self._f = f
        self.pos = 0
        self.file_size = file_size
        self.limit = file_size
        self.nested_arrays_left = MAX_NESTED_ARRAYS

    def remaining(self) -> int:
        return self.limit - self.pos

    def require(self, n: int, what: str) -> None:
        if n <= self.limit - self.pos:
            return
        if self.limit < self.file_size:
            raise GGUFError(
                f"{what} at offset {self.pos} ({n} bytes) goes past the limit on metadata "
                f"({MAX_METADATA_BYTES} bytes)"
            )
        raise Truncated(
            f"{what} at offset {self.pos} needs {n} bytes but the file ends at "
            f"{self.file_size} bytes (truncated?)"
        )

    def read(self, n: int, what: str) -> bytes:
        self.require(n, what)
        data = self._f.read(n)
        if len(data) != n:  # the file shrank under us
            raise Truncated(f"{what} at offset {self.pos}: the file ended early while reading")
        self.pos += n
        return data

    def skip(self, n: int, what: str) -> None:
        self.require(n, what)
        self._f.seek(n, os.SEEK_CUR)
        self.pos += n

    def peek(self, n: int) -> bytes:
        """Up to n bytes from here, never past the limit, without moving."""
        data = self._f.read(max(0, min(n, self.limit - self.pos)))
        self._f.seek(self.pos)
        return data

    def seek(self, pos: int) -> None:
        self._f.seek(pos)
        self.pos = pos

    def u32(self, what: str) -> int:
        return int.from_bytes(self.read(4, what), "little")

    def u64(self, what: str) -> int:
        return int.from_bytes(self.read(8, what), "little")


def _parse(f: BinaryIO, file_size: int, path: str) -> GGUFInfo:
    cur = _Cursor(f, file_size)
    version, tensor_count, kv_count = _read_header(cur)
    # The metadata may not run past a fixed cap, whatever the file size.
    cur.limit = min(file_size, cur.pos + MAX_METADATA_BYTES)
    metadata, tokens_at = _read_metadata(cur, kv_count)
    cur.limit = file_size
    alignment = _alignment(metadata)
    tensors = _read_tensor_infos(cur, tensor_count, alignment)
    data_offset = _align(cur.pos, alignment)
    _check_tensor_data(tensors, data_offset, file_size)
    bos, eos = _special_token_texts(cur, metadata, tokens_at)
    fim = _fim_tokens(cur, metadata, tokens_at)
    return GGUFInfo(
        path=path,
        version=version,
        tensor_count=tensor_count,
        metadata=metadata,
        tensors=tuple(tensors),
        alignment=alignment,
        data_offset=data_offset,
        file_size=file_size,
        bos_token=bos,
        eos_token=eos,
        fim=fim,
    )


def _read_header(cur: _Cursor) -> tuple[int, int, int]:
    if cur.file_size < _HEADER_BYTES:
        raise NotGGUF(
            f"not a GGUF file: it is {cur.file_size} bytes, shorter than the "
            f"{_HEADER_BYTES}-byte header (truncated?)"
        )
    magic = cur.read(4, "magic")
    if magic != GGUF_MAGIC:
        raise NotGGUF(f"not a GGUF file: bad magic {magic!r} at offset 0 (expected b'GGUF')")
    version = cur.u32("version")
    if version not in SUPPORTED_VERSIONS:
        hint = " (a big-endian file?)" if version and version & 0xFFFF == 0 else ""
        raise UnsupportedVersion(
            f"unsupported GGUF version {version} at offset 4{hint}; only 2 and 3 are"
        )
    tensor_count = cur.u64("tensor count")
    kv_count = cur.u64("metadata count")
    if tensor_count > MAX_TENSORS:
        raise GGUFError(f"tensor count {tensor_count} at offset 8 is over the limit {MAX_TENSORS}")
    if kv_count > MAX_KV:
        raise GGUFError(f"metadata count {kv_count} at offset 16 is over the limit {MAX_KV}")
    needed = kv_count * _MIN_KV_BYTES + tensor_count * _MIN_TENSOR_INFO_BYTES
    if needed > cur.remaining():
        raise GGUFError(
            f"the header's metadata count {kv_count} and tensor count {tensor_count} need at "
            f"least {needed} bytes but only {cur.remaining()} follow (truncated?)"
        )
    return version, tensor_count, kv_count


def _read_metadata(cur: _Cursor, kv_count: int) -> tuple[dict[str, Any], tuple[int, int] | None]:
    """Returns the metadata and where the token array's elements start (offset, count)."""
    metadata: dict[str, Any] = {}
    tokens_at: tuple[int, int] | None = None
    for i in range(kv_count):
        start = cur.pos
        try:
            key = _read_string(cur, "metadata key", MAX_STRING_BYTES, strict=True)
        except GGUFError as e:
            # type(e): the kind of failure (what `plain` says) survives the added context.
            raise type(e)(f"metadata entry #{i}: {e}") from None
        try:
            if not key:
                raise GGUFError(f"empty key at offset {start}")
            if key in metadata:
                raise GGUFError(f"duplicate key at offset {start}")
            vtype = cur.u32("value type")
            value_at = cur.pos
            value = metadata[key] = _read_value(cur, vtype, depth=0)
            if key == "tokenizer.ggml.tokens" and vtype == _ARRAY:
                # Remembered so that the BOS/EOS texts can be read back without keeping them all.
                length = value.length if isinstance(value, ArraySummary) else len(value)
                tokens_at = (value_at + 12, length)
        except GGUFError as e:
            raise type(e)(f"metadata key {key!r}: {e}") from None
    return metadata, tokens_at


def _read_string(cur: _Cursor, what: str, max_len: int, *, strict: bool = False) -> str:
    at = cur.pos
    n = cur.u64(f"{what} length")
    if n > max_len:
        raise GGUFError(f"{what} at offset {at}: string length {n} is over the limit {max_len}")
    raw = cur.read(n, what)
    try:
        return raw.decode("utf-8", errors="strict" if strict else "replace")
    except UnicodeDecodeError:
        raise GGUFError(f"{what} at offset {at} is not valid UTF-8") from None


def _skip_strings(cur: _Cursor, count: int) -> None:
    """Validates and skips `count` strings. A vocabulary is 100k+ strings, so their lengths are
    walked in a window of the file rather than with a read each."""
    at = cur.pos
    window, base = b"", at  # window holds the file's bytes from offset base
    for _ in range(count):
        rel = at - base
        if rel + 8 > len(window):
            cur.seek(at)
            window, base, rel = cur.peek(_WINDOW_BYTES), at, 0
            if len(window) < 8:
                cur.u64("array string length")  # raises the usual "file ends" error
        (n,) = _U64.unpack_from(window, rel)
        if n > MAX_STRING_BYTES:
            raise GGUFError(
                f"array string at offset {at}: string length {n} is over the limit "
                f"{MAX_STRING_BYTES}"
            )
        at += 8 + n
        if at > cur.limit:
            cur.seek(at - n)
            cur.skip(n, "array string")  # raises the usual "file ends" error
    cur.seek(at)


def _read_value(cur: _Cursor, vtype: int, *, depth: int) -> Any:
    if vtype in _SCALARS:
        _, fmt, size = _SCALARS[vtype]
        return struct.unpack("<" + fmt, cur.read(size, f"{_SCALARS[vtype][0]} value"))[0]
    if vtype == _STRING:
        return _read_string(cur, "string value", MAX_STRING_BYTES)
    if vtype == _ARRAY:
        return _read_array(cur, depth=depth, keep=True)
    raise GGUFError(f"unknown value type {vtype} at offset {cur.pos - 4}")


def _read_array(cur: _Cursor, *, depth: int, keep: bool) -> list[Any] | ArraySummary:
    """Reads a short array (when keep); summarises a long one, validating its elements."""
    at = cur.pos
    etype = cur.u32("array element type")
    count = cur.u64("array length")
    if etype not in _SCALARS and etype not in (_STRING, _ARRAY):
        raise GGUFError(f"array at offset {at}: unknown element type {etype}")
    if count > MAX_ARRAY_ELEMENTS:
        raise GGUFError(
            f"array at offset {at}: length {count} is over the limit {MAX_ARRAY_ELEMENTS}"
        )
    if etype == _ARRAY and depth + 1 >= MAX_ARRAY_DEPTH:
        raise GGUFError(f"array at offset {at}: arrays nested deeper than {MAX_ARRAY_DEPTH}")
    if etype == _ARRAY:
        cur.nested_arrays_left -= count
        if cur.nested_arrays_left < 0:
            raise GGUFError(f"array at offset {at}: more than {MAX_NESTED_ARRAYS} nested arrays")
    min_size = _SCALARS[etype][2] if etype in _SCALARS else (8 if etype == _STRING else 12)
    # Before any allocation or loop: could the elements fit at all?
    cur.require(count * min_size, f"array of {count} {_type_name(etype)} elements")
    keep = keep and count <= KEEP_ARRAY_ELEMENTS
    if etype in _SCALARS:
        _, fmt, size = _SCALARS[etype]
        if keep:
            return list(struct.unpack(f"<{count}{fmt}", cur.read(count * size, "array elements")))
        cur.skip(count * size, "array elements")
    elif etype == _STRING:
        if keep:
            return [_read_string(cur, "array string", MAX_STRING_BYTES) for _ in range(count)]
        _skip_strings(cur, count)
    elif keep:
        return [_read_array(cur, depth=depth + 1, keep=True) for _ in range(count)]
    else:
        for _ in range(count):
            _read_array(cur, depth=depth + 1, keep=False)
    return ArraySummary(_type_name(etype), count)


def _alignment(metadata: dict[str, Any]) -> int:
    value = metadata.get("general.alignment")
    if value is None:
        return DEFAULT_ALIGNMENT
    if not isinstance(value, int) or isinstance(value, bool):
        raise GGUFError(f"general.alignment is not an integer: {value!r}")
    if value <= 0 or value > MAX_ALIGNMENT or value & (value - 1):
        raise GGUFError(
            f"general.alignment {value} is not a power of two between 1 and {MAX_ALIGNMENT}"
        )
    return value


def _align(n: int, alignment: int) -> int:
    return (n + alignment - 1) // alignment * alignment


def _read_tensor_infos(cur: _Cursor, count: int, alignment: int) -> list[TensorInfo]:
    tensors: list[TensorInfo] = []
    names: set[str] = set()
    for i in range(count):
        try:
            name = _read_string(cur, "tensor name", MAX_TENSOR_NAME_BYTES, strict=True)
        except GGUFError as e:
            raise type(e)(f"tensor #{i}: {e}") from None
        try:
            if not name or name in names:
                raise GGUFError("the name is empty" if not name else "the name is a duplicate")
            tensors.append(_read_tensor_info(cur, name, alignment))
        except GGUFError as e:
            raise type(e)(f"tensor {name!r} (#{i}): {e}") from None
        names.add(name)
    return tensors


def _read_tensor_info(cur: _Cursor, name: str, alignment: int) -> TensorInfo:
    at = cur.pos
    n_dims = cur.u32("dimension count")
    if not 1 <= n_dims <= MAX_DIMS:
        raise GGUFError(f"has {n_dims} dimensions at offset {at} (1 to {MAX_DIMS} allowed)")
    shape = tuple(cur.u64("dimension") for _ in range(n_dims))
    n_elements = 1
    for d in shape:
        n_elements *= d  # Python ints do not wrap; compare against what ggml's int64 holds
        if d > INT64_MAX or n_elements > INT64_MAX:
            raise GGUFError(f"dimensions {list(shape)} overflow int64 (element count)")
    type_at = cur.pos
    type_id = cur.u32("ggml type")
    ggml_type = GGML_TYPES.get(type_id)
    if ggml_type is None:
        raise GGUFError(f"unknown ggml type {type_id} at offset {type_at}")
    if shape[0] % ggml_type.block_size:
        raise GGUFError(
            f"row length {shape[0]} is not a multiple of the {ggml_type.name} block size "
            f"{ggml_type.block_size}"
        )
    nbytes = n_elements // ggml_type.block_size * ggml_type.type_size
    offset = cur.u64("tensor offset")
    if offset % alignment:
        raise GGUFError(f"data offset {offset} is not aligned to {alignment} bytes")
    return TensorInfo(name, shape, ggml_type.name, offset, nbytes)


def _check_tensor_data(tensors: list[TensorInfo], data_offset: int, file_size: int) -> None:
    if tensors and data_offset > file_size:
        raise Truncated(
            f"the tensor data would start at offset {data_offset}, past the end of the file "
            f"({file_size} bytes)"
        )
    for t in tensors:
        start = data_offset + t.offset
        if start + t.nbytes > file_size:
            raise Truncated(
                f"tensor {t.name!r} (offset {start}, {t.nbytes} bytes) runs past the end of the "
                f"file ({file_size} bytes)"
            )
    # Sorted by offset, each tensor must end before the next begins. Empty tensors hold no bytes.
    placed = sorted((t for t in tensors if t.nbytes), key=lambda t: t.offset)
    for before, after in zip(placed, placed[1:], strict=False):
        if before.offset + before.nbytes > after.offset:
            raise GGUFError(
                f"tensor {before.name!r} (offset {data_offset + before.offset}, "
                f"{before.nbytes} bytes) overlaps tensor {after.name!r} "
                f"(offset {data_offset + after.offset})"
            )


def _special_token_texts(
    cur: _Cursor, metadata: dict[str, Any], tokens_at: tuple[int, int] | None
) -> tuple[str | None, str | None]:
    """The BOS and EOS token texts, read back from the (already validated) token array."""
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens_at is None or not isinstance(tokens, ArraySummary | list):
        return None, None
    if isinstance(tokens, ArraySummary) and tokens.element_type != "string":
        return None, None
    if isinstance(tokens, list) and not all(isinstance(t, str) for t in tokens):
        return None, None
    ids: dict[str, int] = {}
    for role in ("bos", "eos"):
        value = metadata.get(f"tokenizer.ggml.{role}_token_id")
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < tokens_at[1]:
            ids[role] = value
    if isinstance(tokens, list):
        texts = {role: tokens[i] for role, i in ids.items()}
    else:
        texts = _token_texts(cur, tokens_at[0], set(ids.values()))
        texts = {role: texts[i] for role, i in ids.items()}
    return texts.get("bos"), texts.get("eos")


def _token_texts(cur: _Cursor, start: int, wanted: set[int]) -> dict[int, str]:
    texts: dict[int, str] = {}
    if not wanted:
        return texts
    cur.seek(start)
    done = 0
    for i in sorted(wanted):
        _skip_strings(cur, i - done)
        texts[i] = _read_string(cur, "token", MAX_STRING_BYTES)
        done = i + 1
    return texts


def _fim_tokens(
    cur: _Cursor, metadata: dict[str, Any], tokens_at: tuple[int, int] | None
) -> dict[str, FimToken]:
    """The FIM tokens: the header's ids, else the tokens llama.cpp recognises by their text
    (one walk over the already validated vocabulary, reading only strings of a wanted length)."""
    tokens = metadata.get("tokenizer.ggml.tokens")
    if tokens_at is None or not isinstance(tokens, ArraySummary | list):
        return {}
    if isinstance(tokens, ArraySummary) and tokens.element_type != "string":
        return {}
    if isinstance(tokens, list) and not all(isinstance(t, str) for t in tokens):
        return {}
    ids = fim_tokens.header_ids(metadata, tokens_at[1])
    wanted = fim_tokens.all_texts() if len(ids) < len(fim_tokens.ROLES) else frozenset()
    if isinstance(tokens, list):
        found = {}
        for i, text in enumerate(tokens):
            if text in wanted:
                found.setdefault(text, i)
        texts = dict(enumerate(tokens))
    else:
        found = _find_token_texts(cur, tokens_at[0], tokens_at[1], wanted)
        texts = {}
    for role, i in fim_tokens.by_text(found).items():
        ids.setdefault(role, i)
    if not isinstance(tokens, list):
        texts = _token_texts(cur, tokens_at[0], set(ids.values()))
    return {role: FimToken(i, texts[i]) for role, i in ids.items()}


def _find_token_texts(
    cur: _Cursor, start: int, count: int, wanted: frozenset[str]
) -> dict[str, int]:
    """Each of the `wanted` texts found among the `count` strings at `start`, with its lowest id.
    A vocabulary is 100k+ strings: they are walked in a window of the file, and only a string
    whose byte length some wanted text has is decoded."""
    if not wanted:
        return {}
    encoded = {text.encode("utf-8"): text for text in wanted}
    lengths = {len(raw) for raw in encoded}
    found: dict[str, int] = {}
    at = start
    window, base = b"", start
    for i in range(count):
        rel = at - base
        if rel + 8 > len(window):
            cur.seek(at)
            window, base, rel = cur.peek(_WINDOW_BYTES), at, 0
        (n,) = _U64.unpack_from(window, rel)
        if n in lengths:
            if rel + 8 + n > len(window):
                cur.seek(at)
                window, base, rel = cur.peek(_WINDOW_BYTES), at, 0
            text = encoded.get(bytes(window[rel + 8 : rel + 8 + n]))
            if text is not None and text not in found:
                found[text] = i
        at += 8 + n
    return found
