"""Tiny real GGUF files for the registry tests (the gguf package's writer, shared with the reader's
tests) and broken copies of them."""

from pathlib import Path

from tests.inference.gguf.conftest import TEMPLATE, write_tiny_gguf

__all__ = ["TEMPLATE", "corrupt_copy", "tiny_gguf", "write_tiny_gguf"]


def tiny_gguf(path: Path, **options) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_tiny_gguf(path, **options)


def corrupt_copy(source: Path, target: Path) -> Path:
    """The first half of a valid file: the header reads, the tensor data runs past the end."""
    data = source.read_bytes()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data[: len(data) // 2])
    return target
