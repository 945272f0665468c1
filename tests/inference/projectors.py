"""Projectors for the catalog's tests: the loadable tiny one of projector_gguf, and variants of
it whose header is wrong in one named way (a key left out or changed), for the refusals."""

from contextlib import contextmanager
from pathlib import Path
from unittest import mock

from gguf import GGUFWriter

from tests.inference.projector_gguf import write_projector

__all__ = ["projector_at", "projector_variant"]


def projector_at(path: Path, model: Path, **options) -> Path:
    """write_projector's projector for `model`, in a directory made for it when needed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return write_projector(path, model, **options)


@contextmanager
def _keys_changed(drop: tuple[str, ...], change: dict):
    real = GGUFWriter.add_key_value

    def add_key_value(self, key, val, vtype, sub_type=None):
        if key in drop:
            return None
        return real(self, key, change.get(key, val), vtype, sub_type)

    with mock.patch.object(GGUFWriter, "add_key_value", add_key_value):
        yield


def projector_variant(path: Path, model: Path, *, drop: tuple[str, ...] = (),
                      change: dict | None = None, **options) -> Path:  # fmt: skip
    """write_projector's projector for `model`, with the metadata keys in `drop` left out and
    those in `change` given other values (of the same type)."""
    with _keys_changed(drop, change or {}):
        return projector_at(path, model, **options)
