"""Random damage to a valid file: the reader returns a GGUFInfo or raises a GGUFError."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inference.gguf import GGUFError, GGUFInfo, read_gguf

# Values that make parsers misbehave, as the u32/u64 fields they would land in.
_NASTY_INTS = [0, 1, 2, 3, 9, 31, 2**16, 2**24, 2**31 - 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]
_NASTY_BYTES = st.sampled_from(
    [struct.pack("<I", n & 0xFFFFFFFF) for n in _NASTY_INTS]
    + [struct.pack("<Q", n) for n in _NASTY_INTS]
)


def _damage(size: int, header_end: int) -> st.SearchStrategy:
    at = st.integers(0, header_end - 1)
    return st.one_of(
        st.tuples(st.just("flip"), at, st.integers(1, 255)),
        st.tuples(st.just("overwrite"), at, st.binary(min_size=1, max_size=8) | _NASTY_BYTES),
        st.tuples(st.just("insert"), at, st.binary(min_size=1, max_size=16)),
        st.tuples(st.just("truncate"), st.integers(0, size), st.none()),
    )


def _apply(data: bytes, damages: list[tuple]) -> bytes:
    buf = bytearray(data)
    for kind, at, arg in damages:
        at = min(at, len(buf))
        if kind == "flip" and at < len(buf):
            buf[at] ^= arg
        elif kind == "overwrite":
            buf[at : at + len(arg)] = arg
        elif kind == "insert":
            buf[at:at] = arg
        elif kind == "truncate":
            del buf[at:]
    return bytes(buf)


@pytest.fixture(scope="module")
def fuzz_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")


def test_random_damage_gives_an_info_or_a_gguf_error(
    tiny_gguf_bytes: bytes, fuzz_dir: Path
) -> None:
    path = fuzz_dir / "damaged.gguf"
    header_end = read_gguf_bytes(tiny_gguf_bytes, path).data_offset

    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.lists(_damage(len(tiny_gguf_bytes), header_end), min_size=1, max_size=4))
    def check(damages: list[tuple]) -> None:
        path.write_bytes(_apply(tiny_gguf_bytes, damages))
        try:
            info = read_gguf(path)
        except GGUFError as e:
            # The catch-all in read_gguf would hide a bug in the checks: none may reach it.
            assert "unexpected error" not in str(e), str(e)
        else:
            assert isinstance(info, GGUFInfo)
            for t in info.tensors:
                assert info.data_offset + t.offset + t.nbytes <= info.file_size

    check()


def read_gguf_bytes(data: bytes, path: Path) -> GGUFInfo:
    path.write_bytes(data)
    return read_gguf(path)
