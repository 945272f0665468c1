"""Tiny real GGUF files for the registry tests (the gguf package's writer, shared with the reader's
tests) and broken copies of them."""

from pathlib import Path

from tests.inference.gguf.conftest import TEMPLATE, write_tiny_gguf

__all__ = ["TEMPLATE", "corrupt_copy", "tiny_gguf", "write_tiny_gguf"]


def tiny_gguf(path: Path, *, same_bytes: bool = False, **options) -> Path:
    """A tiny model at `path`. Files at different paths differ by a metadata key (the registry
    keeps one entry per file, and two tiny models are meant as two models) unless
    `same_bytes`: then every call writes the same file (a copy)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not same_bytes:
        extra = options.pop("extra", None)

        def mark(writer):
            writer.add_string("test.written_at", str(path))
            if extra is not None:
                extra(writer)

        options["extra"] = mark
    return write_tiny_gguf(path, **options)


def corrupt_copy(source: Path, target: Path) -> Path:
    """The first half of a valid file: the header reads, the tensor data runs past the end."""
    data = source.read_bytes()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(data[: len(data) // 2])
    return target
