"""Embeddings through the official ollama and openai packages against the live appliance:
/api/embed, /api/embeddings and /v1/embeddings on the starter model, with a chat key."""

import base64
import math
import struct

import ollama
import openai
import pytest
from openai import OpenAI

from tests.dashboard.api.server import STARTER, read_json

pytestmark = pytest.mark.model

N_EMBD = 576  # SmolLM2-135M's embedding length
TEXTS = ["Why is the sky blue?", "The kitchen lights are on.", "hello"]


@pytest.fixture
def ollama_client(appliance) -> ollama.Client:
    return ollama.Client(host=appliance.url, headers=appliance.headers("chat-app"), timeout=300)


@pytest.fixture
def openai_client(appliance) -> OpenAI:
    return OpenAI(base_url=f"{appliance.url}/v1", api_key=appliance.keys["chat-app"],
                  max_retries=0, timeout=300)  # fmt: skip


def length(vector) -> float:
    return math.sqrt(math.fsum(x * x for x in vector))


def largest_difference(a, b) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) for x, y in zip(a, b, strict=True))


def test_ollama_embed_gives_one_unit_vector_per_input(ollama_client):
    answer = ollama_client.embed(model=STARTER, input=TEXTS)
    assert answer.model == STARTER
    assert len(answer.embeddings) == len(TEXTS)
    for vector in answer.embeddings:
        assert len(vector) == N_EMBD
        assert abs(length(vector) - 1.0) < 1e-5
    assert answer.prompt_eval_count >= len(TEXTS)
    assert answer.total_duration > 0
    assert answer.load_duration >= 0


def test_the_same_text_gives_the_same_vector_alone_or_in_a_list(ollama_client, openai_client):
    together = ollama_client.embed(model=STARTER, input=TEXTS).embeddings
    for text, vector in zip(TEXTS, together, strict=True):
        alone = ollama_client.embed(model=STARTER, input=text).embeddings[0]
        assert largest_difference(alone, vector) < 1e-5
    first = (
        openai_client.embeddings.create(model=STARTER, input=TEXTS[0], encoding_format="float")
        .data[0]
        .embedding
    )
    assert largest_difference(first, together[0]) < 1e-5  # both dialects normalise the same
    sky, kitchen, _ = together
    assert math.fsum(a * b for a, b in zip(sky, kitchen, strict=True)) < 0.99


def test_the_legacy_endpoint_gives_the_raw_vector_as_ollama_does(ollama_client):
    raw = ollama_client.embeddings(model=STARTER, prompt=TEXTS[0]).embedding
    unit = ollama_client.embed(model=STARTER, input=TEXTS[0]).embeddings[0]
    assert len(raw) == N_EMBD
    assert length(raw) > 1.5  # not normalised
    scale = length(raw)
    assert largest_difference([x / scale for x in raw], unit) < 1e-5


def test_an_over_long_input_is_truncated_by_default_and_refused_with_truncate_false(
    ollama_client,
):
    long_text = "word " * 2600
    cut = ollama_client.embed(model=STARTER, input=long_text)
    assert len(cut.embeddings) == 1
    assert 0 < cut.prompt_eval_count < 2600
    with pytest.raises(ollama.ResponseError) as refused:
        ollama_client.embed(model=STARTER, input=long_text, truncate=False)
    assert refused.value.status_code == 400
    assert "tokens" in refused.value.error


def test_openai_embeddings_as_floats_and_as_base64_agree(openai_client):
    floats = openai_client.embeddings.create(model=STARTER, input=TEXTS, encoding_format="float")
    assert floats.object == "list"
    assert floats.model == STARTER
    assert [d.index for d in floats.data] == [0, 1, 2]
    assert all(d.object == "embedding" and len(d.embedding) == N_EMBD for d in floats.data)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 0
    encoded = openai_client.embeddings.create(model=STARTER, input=TEXTS,
                                              encoding_format="base64")  # fmt: skip
    for plain, packed in zip(floats.data, encoded.data, strict=True):
        raw = packed.embedding
        vector = (
            struct.unpack(f"<{N_EMBD}f", base64.b64decode(raw)) if isinstance(raw, str) else raw
        )  # the SDK decodes base64 itself in some versions
        assert largest_difference(plain.embedding, vector) < 1e-6
    # Without encoding_format the SDK asks for base64 and decodes it.
    default = openai_client.embeddings.create(model=STARTER, input=TEXTS[0])
    assert largest_difference(default.data[0].embedding, floats.data[0].embedding) < 1e-6


def test_openai_token_arrays_embed_like_each_other(openai_client):
    ids = [1, 504, 3117, 314, 260, 6523]
    one = openai_client.embeddings.create(model=STARTER, input=ids, encoding_format="float")
    many = openai_client.embeddings.create(model=STARTER, input=[ids, ids[:3]],
                                           encoding_format="float")  # fmt: skip
    assert len(one.data) == 1 and len(many.data) == 2
    assert one.usage.prompt_tokens == len(ids)
    assert many.usage.prompt_tokens == len(ids) + 3
    assert largest_difference(one.data[0].embedding, many.data[0].embedding) < 1e-5


def test_a_token_id_outside_the_vocabulary_is_a_400_naming_the_input(openai_client):
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.embeddings.create(model=STARTER, input=[[1, 2], [1, 10_000_000]])
    error = refused.value.body
    assert error["param"] == "input"
    assert "10000000" in error["message"] and "vocabulary" in error["message"]


def test_other_dimensions_and_bad_inputs_are_refused_clearly(openai_client, http, chat_headers):
    with pytest.raises(openai.BadRequestError) as refused:
        openai_client.embeddings.create(model=STARTER, input="hi", dimensions=64)
    assert refused.value.body["param"] == "dimensions"
    assert str(N_EMBD) in refused.value.body["message"]
    same = openai_client.embeddings.create(model=STARTER, input="hi", dimensions=N_EMBD,
                                           encoding_format="float")  # fmt: skip
    assert len(same.data[0].embedding) == N_EMBD
    for body in ({"model": STARTER, "input": ""}, {"model": STARTER, "input": []},
                 {"model": STARTER, "input": [-3]}, {"model": STARTER, "input": {"a": 1}},
                 {"model": STARTER, "input": "x", "encoding_format": "int8"}):  # fmt: skip
        response = http.post("/v1/embeddings", json=body, headers=chat_headers)
        assert response.status_code == 400, body
        assert read_json(response)["error"]["param"] in ("input", "encoding_format")
    response = http.post("/api/embed", json={"model": STARTER, "input": [1]},
                         headers=chat_headers)  # fmt: skip
    assert response.status_code == 400 and "input" in read_json(response)["error"]
    response = http.post("/v1/embeddings", json={"model": "nope", "input": "x"},
                         headers=chat_headers)  # fmt: skip
    assert response.status_code == 404


def test_an_empty_input_loads_the_model_with_a_manage_key_only(appliance, ollama_client):
    with pytest.raises(ollama.ResponseError) as refused:
        ollama_client.embed(model=STARTER, input="")
    assert refused.value.status_code == 403
    manager = ollama.Client(host=appliance.url, headers=appliance.headers("manage-app"),
                            timeout=300)  # fmt: skip
    loaded = manager.embed(model=STARTER, input="")
    assert loaded.embeddings == []
    assert manager.embeddings(model=STARTER, prompt="").embedding == []
    assert STARTER in [m.model.split(":")[0] for m in manager.ps().models]
