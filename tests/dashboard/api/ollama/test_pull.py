"""/api/pull through the real ollama client, against the live appliance and a registry on
loopback serving the starter model's real GGUF: progress in Ollama's shape, then a chat with
the pulled name; a wrong digest, a dropped connection, a Hugging Face name, a chat key and a
name the registry does not have."""

import hashlib

import httpx
import ollama
import pytest

from tests.dashboard.api.server import Appliance
from tests.inference.catalog.pulling.registry import FakeRegistry, digest_of
from tests.inference.ggufs import tiny_gguf

pytestmark = pytest.mark.model


# The starter model with its general.name changed (same length, same layout): a real model
# that is not a copy of the one registered already, so it is downloaded and loaded itself.
STARTER_NAME = b"Smollm2 135M 8k Lc100K Mix1 Ep2"
PULLED_NAME = b"Pulled2 135M 8k Lc100K Mix1 Ep2"


@pytest.fixture(scope="module")
def registry(starter_path, tmp_path_factory):
    server = FakeRegistry().start()
    starter = starter_path.read_bytes()
    server.starter = starter.replace(STARTER_NAME, PULLED_NAME, 1)
    assert server.starter != starter
    server.publish("home", "smol", "v1", server.starter)
    server.tiny = tiny_gguf(tmp_path_factory.mktemp("served") / "tiny.gguf").read_bytes()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def puller(appliance, registry):
    """The appliance's data served with MODEL_REGISTRY_URL and HF_ENDPOINT on the loopback
    registry; the models it pulled are deleted at the end."""
    running = Appliance(appliance.data_dir, dict(appliance.env), dict(appliance.keys))
    running.start(MODEL_REGISTRY_URL=registry.base, HF_ENDPOINT=registry.base)
    yield running
    admin = ollama.Client(host=running.url, headers=running.headers("admin-app"), timeout=60)
    for listed in admin.list().models:
        if "/" in listed.model:  # what this module pulled: every name has a host
            admin.delete(listed.model)
    running.stop()


def client(puller, key: str = "admin-app") -> ollama.Client:
    return ollama.Client(host=puller.url, headers=puller.headers(key), timeout=300)


def listed(puller) -> set[str]:
    return {m.model for m in client(puller).list().models}


def test_a_pulled_model_streams_ollamas_progress_and_then_chats(puller, registry):
    name = f"{registry.host}/home/smol:v1"
    digest = digest_of(registry.starter)

    progress = list(client(puller).pull(name, stream=True))

    statuses = [p.status for p in progress]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    layer = [p for p in progress if p.digest == digest]
    assert layer and all(p.status == f"pulling {digest[7:19]}" for p in layer)
    assert all(p.total == len(registry.starter) for p in layer)
    completed = [p.completed for p in layer]
    assert completed == sorted(completed) and completed[-1] == len(registry.starter)
    assert name in listed(puller)

    answer = client(puller, "chat-app").chat(
        model=name, messages=[{"role": "user", "content": "Say hello."}],
        options={"num_predict": 8, "temperature": 0},
    )  # fmt: skip

    assert answer.message.content.strip()
    assert answer.model == name


def test_a_chat_key_may_not_pull(puller, registry):
    with pytest.raises(ollama.ResponseError) as refused:
        client(puller, "chat-app").pull(f"{registry.host}/home/smol:v1")
    assert refused.value.status_code == 403


def test_a_name_the_registry_does_not_have_is_an_error_line_or_a_404(puller, registry):
    with pytest.raises(ollama.ResponseError, match="file does not exist"):
        list(client(puller).pull(f"{registry.host}/home/nothing:v1", stream=True))

    with pytest.raises(ollama.ResponseError) as missing:
        client(puller).pull(f"{registry.host}/home/nothing:v1", stream=False)
    assert missing.value.status_code == 404


def test_a_bad_name_is_a_400_naming_it(puller):
    answer = httpx.post(f"{puller.url}/api/pull", json={"model": "a/b/c/d"},
                        headers=puller.headers("admin-app"), timeout=30)  # fmt: skip
    assert answer.status_code == 400 and "too many parts" in answer.json()["error"]


def test_a_blob_that_does_not_match_its_digest_is_an_error_and_nothing_is_registered(
    puller, registry
):
    registry.publish("home", "liar", "v1", registry.tiny, digest=digest_of(b"not this"))
    name = f"{registry.host}/home/liar:v1"

    with pytest.raises(ollama.ResponseError, match="is not the layer's"):
        list(client(puller).pull(name, stream=True))

    assert name not in listed(puller)


def test_a_dropped_connection_is_resumed_with_a_range_request(puller, registry):
    registry.publish("home", "tiny", "resume", registry.tiny)
    registry.drop_after, registry.drops_left = 1000, 1
    name = f"{registry.host}/home/tiny:resume"

    final = client(puller).pull(name, stream=False)

    assert final.status == "success"
    ranges = [asked for path, asked in registry.blob_requests()
              if path == f"store/{digest_of(registry.tiny)}"]  # fmt: skip
    assert ranges == [None, "bytes=1000-"]
    assert name in listed(puller)


def test_a_hugging_face_name_pulls_the_file_of_its_quant(puller, registry):
    registry.publish_hf("someone/Tiny-GGUF", {"tiny.Q8_0.gguf": registry.tiny})
    name = "hf.co/someone/Tiny-GGUF:Q8_0"

    final = client(puller).pull(name, stream=False)

    assert final.status == "success"
    shown = client(puller).show(name)
    assert shown.details.format == "gguf"
    tags = {m.model: m for m in client(puller).list().models}
    assert tags[name].digest == hashlib.sha256(registry.tiny).hexdigest()


def test_the_same_file_under_two_names_is_one_model_until_one_name_is_deleted(puller, registry):
    registry.publish_hf("someone/Tiny-GGUF", {"tiny.Q8_0.gguf": registry.tiny})
    registry.publish("home", "tiny", "again", registry.tiny)
    first, second = "hf.co/someone/Tiny-GGUF:Q8_0", f"{registry.host}/home/tiny:again"
    client(puller).pull(first)
    blobs = len(registry.blob_requests())

    client(puller).pull(second)

    assert len(registry.blob_requests()) == blobs  # the blob was here already
    tags = {m.model: m.digest for m in client(puller).list().models}
    assert tags[first] == tags[second]

    client(puller).delete(first)

    assert second in listed(puller) and first not in listed(puller)
