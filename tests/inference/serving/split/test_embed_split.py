"""Embeddings and tokens in split mode: SplitClient → tasks "inference.embed" and
"inference.tokenize" → a real inference worker process and its runner, over real Redis; the
vectors and the tokens come back intact, refusals as the same error events."""

import math

import pytest

from inference.engine.media import MEDIA_MARKER, Image
from inference.serving.embeds import EmbedError, EmbedJob
from inference.serving.tokens import TokenError, TokenJob
from tests.inference.projector_gguf import picture

pytestmark = [pytest.mark.redis, pytest.mark.model]

TEXTS = ["Why is the sky blue?", "hello"]


async def test_a_worker_embeds_texts_and_token_arrays(split_client, spec, shared_worker):
    job = EmbedJob(spec.name, [*TEXTS, [1, 2, 3]], truncate=True, keep_alive=-1)
    result = await split_client.embed(job, spec)
    embedding = result.embedding
    assert embedding.count == 3 and embedding.dim == 576
    assert embedding.token_counts[2] == 3
    for vector in embedding.vectors(normalised=True):
        assert abs(math.sqrt(math.fsum(x * x for x in vector)) - 1.0) < 1e-5
    again = await split_client.embed(EmbedJob(spec.name, [TEXTS[1]]), spec)
    alone = again.embedding.vectors(normalised=False)[0]
    together = embedding.vectors(normalised=False)[1]
    assert max(abs(a - b) for a, b in zip(alone, together, strict=True)) < 1e-5


async def test_a_refusal_comes_back_as_the_same_error_event(split_client, spec, shared_worker):
    with pytest.raises(EmbedError) as refused:
        await split_client.embed(EmbedJob(spec.name, [[10_000_000]]), spec)
    assert refused.value.event["code"] == "invalid"
    assert refused.value.event["field"] == "input"
    with pytest.raises(EmbedError) as too_long:
        await split_client.embed(EmbedJob(spec.name, ["word " * 1500], truncate=False), spec)
    assert too_long.value.event["code"] == "too_long"


async def test_a_worker_tokenizes_and_detokenizes(split_client, spec, shared_worker):
    text = "Why is the sky blue? 🌍 <|im_start|>"
    tokens = await split_client.tokenize(spec, text, add_special=False, with_pieces=True)
    assert len(tokens.tokens) == len(tokens.pieces) > 5
    assert b"".join(tokens.pieces).decode() == text
    back = await split_client.detokenize(spec, list(tokens.tokens))
    assert back.text == text
    special = await split_client.tokenize(spec, "<|im_start|>", add_special=False)
    plain = await split_client.tokenize(spec, "<|im_start|>", add_special=False,
                                        parse_special=False)  # fmt: skip
    assert len(special.tokens) == 1 and len(plain.tokens) > 1
    with pytest.raises(TokenError) as refused:
        await split_client.detokenize(spec, [10_000_000])
    assert (refused.value.event["code"], refused.value.event["field"]) == ("invalid", "tokens")


async def test_a_tokenize_carries_its_images_to_the_runner(split_client, spec, shared_worker):
    """The images travel in the task (their wire form): the starter here has no projector, so
    its runner refuses them as it refuses a generation's, rather than counting the text."""
    image = Image.from_bytes(picture(seed=3))
    job = TokenJob(spec.name, "tokenize", text=f"Look: {MEDIA_MARKER}", images=(image,))
    assert TokenJob(**job.to_dict()).images == (image,)
    with pytest.raises(TokenError) as refused:
        await split_client.tokenize(spec, f"Look: {MEDIA_MARKER}", images=(image,))
    assert refused.value.event["code"] == "invalid"
    assert "does not take images" in refused.value.event["message"]
