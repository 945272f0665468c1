"""A box's model files by content: found wherever they lie, hashed once per version of a file."""

import hashlib
import os

from inference.serving import model_index
from inference.serving.announcement import ServedModel
from inference.serving.model_index import ModelIndex


def write(path, data: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def test_it_finds_every_gguf_under_the_models_dir_and_the_packaged_files(tmp_path):
    nested = write(tmp_path / "models" / "family" / "a.gguf", b"model a")
    packaged = write(tmp_path / "site-packages" / "starter.gguf", b"starter")
    write(tmp_path / "models" / "notes.txt", b"not a model")
    write(tmp_path / "models" / ".download-3.part.gguf", b"half a download")
    write(tmp_path / "models" / ".blobs" / "b.gguf", b"an upload")
    index = ModelIndex([tmp_path / "models"], [tmp_path / "site-packages" / "starter.gguf"])
    index.refresh()
    assert index.path_for(nested) == str(tmp_path / "models" / "family" / "a.gguf")
    assert index.path_for(packaged) == str(tmp_path / "site-packages" / "starter.gguf")
    assert set(index.served()) == {ServedModel(nested, 7), ServedModel(packaged, 7)}


def test_a_file_is_hashed_once_until_it_changes_and_forgotten_when_removed(tmp_path, monkeypatch):
    path = tmp_path / "models" / "a.gguf"
    first = write(path, b"first")
    hashed = []
    real = model_index._sha256
    monkeypatch.setattr(model_index, "_sha256", lambda p: hashed.append(p) or real(p))
    index = ModelIndex([tmp_path / "models"])
    index.refresh()
    index.refresh()
    assert len(hashed) == 1
    second = write(path, b"second, longer")
    index.refresh()
    assert (index.path_for(first), index.path_for(second)) == (None, str(path))
    path.unlink()
    index.refresh()
    assert index.served() == ()


def test_the_digests_survive_a_restart_without_hashing_again(tmp_path, monkeypatch):
    sha = write(tmp_path / "models" / "a.gguf", b"weights")
    cache = tmp_path / "model-index.json"
    ModelIndex([tmp_path / "models"], cache_file=cache).refresh()
    monkeypatch.setattr(model_index, "_sha256", lambda p: (_ for _ in ()).throw(AssertionError))
    restarted = ModelIndex([tmp_path / "models"], cache_file=cache)
    assert restarted.path_for(sha) == str(tmp_path / "models" / "a.gguf")  # before any pass
    restarted.refresh()
    assert restarted.path_for(sha) is not None


def test_a_saved_digest_of_a_file_changed_since_is_not_trusted(tmp_path):
    path = tmp_path / "models" / "a.gguf"
    old = write(path, b"old")
    cache = tmp_path / "model-index.json"
    ModelIndex([tmp_path / "models"], cache_file=cache).refresh()
    write(path, b"new weights")
    os.utime(path, ns=(1, 1))
    restarted = ModelIndex([tmp_path / "models"], cache_file=cache)
    assert restarted.path_for(old) is None
