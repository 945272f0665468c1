"""Images in the engine without a model: picture headers, pseudo ids, how a prompt with images is
cut into steps, and the encoder phase (tests/inference/engine/fakes.py's FakeVisionRunner)."""

import struct
import threading

import numpy as np
import pytest

from inference.engine import Engine, GenerationRequest, SamplingParams
from inference.engine.media import MEDIA_MARKER, Image
from inference.engine.refusals import RefusalKind, Refused
from inference.engine.speculation.policy import Speculation, text_after_images
from inference.engine.vision import (
    MAX_PIXELS,
    EmbeddingCache,
    ImageSpan,
    check_pictures,
    chunk_length,
    first_position,
    image_key,
    kv_position,
    media_ids,
    picture_size,
    reusable,
)
from tests.inference.projector_gguf import picture

from .fakes import FakeRunner, FakeVisionRunner, wait_until

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


def jpeg(width: int, height: int) -> bytes:
    """A JPEG's markers up to its frame header (an APP0 segment first), enough for its size."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00" + bytes(9)
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + bytes(3)
    return b"\xff\xd8" + app0 + sof0 + b"\xff\xd9"


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + bytes(8)


def png_claiming(width: int, height: int) -> bytes:
    return picture(8, 8)[:16] + struct.pack(">II", width, height) + picture(8, 8)[24:]


@pytest.mark.parametrize("data, size", [
    (picture(64, 48), (64, 48)), (picture(30, 20, kind="bmp"), (30, 20)),
    (jpeg(640, 480), (640, 480)), (gif(17, 9), (17, 9)),
])  # fmt: skip
def test_a_pictures_size_is_read_from_its_header(data, size):
    assert picture_size(Image.from_bytes(data)) == size


def test_a_picture_of_too_many_pixels_is_refused_before_it_is_decoded():
    check_pictures((Image.from_bytes(png_claiming(5000, 5000)),))  # 25 megapixels: fine
    with pytest.raises(Refused) as refused:
        check_pictures((Image.from_bytes(picture()),
                        Image.from_bytes(png_claiming(10_000, 10_000))))  # fmt: skip
    assert refused.value.kind == RefusalKind.INVALID and refused.value.field == "images"
    assert "image 2 is 10000 x 10000 pixels" in refused.value.message
    assert f"{MAX_PIXELS / 1e6:g} megapixels" in refused.value.message


def test_a_picture_whose_header_cannot_be_read_is_refused_as_corrupt():
    with pytest.raises(Refused, match="corrupt"):
        check_pictures((Image.from_bytes(b"\xff\xd8\xff\xe0 truncated"),))


def test_an_images_pseudo_ids_are_negative_int32_stable_and_its_own():
    key = image_key("projector", "a" * 64)
    ids = media_ids(key, 64)
    assert all(-(2**31) <= i < 0 for i in ids) and len(set(ids)) == 64
    assert media_ids(key, 64) == ids
    assert not set(media_ids(image_key("projector", "b" * 64), 64)) & set(ids)
    assert not set(media_ids(image_key("another projector", "a" * 64), 64)) & set(ids)


def spans(*ranges, whole=False):
    return [ImageSpan(start, n, f"k{start}", "d", whole) for start, n in ranges]


@pytest.mark.parametrize("start, take, expected", [
    (0, 5, 5),  # text only
    (0, 30, 20),  # text, then the image to its end: not the text after it
    (12, 4, 4),  # inside the image, cut by the budget
    (20, 50, 50),  # text after the image
])  # fmt: skip
def test_a_chunk_is_text_then_one_image_up_to_its_end(start, take, expected):
    assert chunk_length(spans((10, 10)), start, take) == expected


@pytest.mark.parametrize("start, take, expected", [
    (0, 15, 10),  # the text before it now; the image in a step of its own
    (0, 25, 20),  # text and the whole image fit
    (10, 4, 10),  # at its start: whole, past the budget
    (14, 2, 6),  # a cached part of it read: the rest, whole
])  # fmt: skip
def test_an_image_the_projector_wants_whole_is_never_cut(start, take, expected):
    assert chunk_length(spans((10, 10), whole=True), start, take) == expected


def test_an_image_read_whole_waits_rather_than_stretch_a_persons_step():
    whole = spans((10, 10), whole=True)
    assert chunk_length(whole, 10, 4, may_exceed=False) == 0
    assert chunk_length(whole, 0, 15, may_exceed=False) == 10
    assert chunk_length(whole, 10, 12, may_exceed=False) == 10  # it fits: it goes


def qwen_image(start: int, nx: int, ny: int) -> ImageSpan:
    """An M-RoPE image of nx x ny rows placed as libmtmd places Qwen2-VL's: each row at the
    image's first position in t, plus its row in y and its column in x; z unused."""
    n = nx * ny
    i = np.arange(n)
    offsets = np.stack([np.zeros(n), i // nx, i % nx, np.zeros(n)]).astype(np.int32)
    steps = np.repeat(np.array([[1], [1], [1], [0]], dtype=np.int32), n, axis=1)
    return ImageSpan(start, n, f"k{start}", "d", n_pos=max(nx, ny), mrope=(offsets, steps))


# 5 text tokens, a 4 x 2 image (8 tokens, 4 positions), 3 text, a 2 x 3 image (6, 3), text.
MROPE_PROMPT = [qwen_image(5, 4, 2), qwen_image(16, 2, 3)]


def test_without_mrope_a_tokens_kv_position_is_its_index():
    assert [kv_position(spans((10, 10), (25, 5)), i) for i in range(40)] == list(range(40))
    assert kv_position(None, 17) == 17 and kv_position([], 17) == 17


@pytest.mark.parametrize("index, position", [
    (0, 0), (4, 4),  # text before any image
    (5, 5), (9, 5), (12, 5),  # every row of the first image sits at its first position
    (13, 9), (15, 11),  # text after it: the image took max(4, 2) = 4 positions, not 8
    (16, 12), (21, 12),  # the second image, after 4 + 3 skipped
    (22, 15), (30, 23),  # text after both (and an answer's tokens)
])  # fmt: skip
def test_an_mrope_image_takes_its_longer_sides_positions_and_its_rows_share_the_first(
    index, position
):
    assert kv_position(MROPE_PROMPT, index) == position


def test_an_mrope_images_rows_are_placed_by_row_and_column_from_its_first_position():
    first, second = MROPE_PROMPT
    assert first_position(MROPE_PROMPT, first) == 5
    assert first_position(MROPE_PROMPT, second) == 12
    # llama.cpp's sections t, y (row), x (column), z; row 5 of a 4-wide image is (1, 1).
    assert first.row_positions(5, 5, 6)[:, 0].tolist() == [5, 6, 6, 0]
    assert second.row_positions(12, 0, 6).tolist() == [
        [12] * 6, [12, 12, 13, 13, 14, 14], [12, 13, 12, 13, 12, 13], [0] * 6]  # fmt: skip


@pytest.mark.parametrize("cached, kept", [
    (4, 4), (5, 5),  # before the image, or up to its start
    (6, 5), (12, 5),  # inside it: the image is read again whole
    (13, 13), (18, 16), (25, 25),  # after it; inside the second one; after both
])  # fmt: skip
def test_a_cached_prefix_keeps_an_mrope_image_whole_or_not_at_all(cached, kept):
    assert reusable(MROPE_PROMPT, cached) == kept


def test_a_cached_prefix_may_end_inside_an_image_without_mrope():
    assert reusable(spans((5, 8)), 9) == 9 and reusable(None, 9) == 9


def test_a_cached_prefix_keeps_an_image_the_projector_reads_whole_whole_or_not_at_all():
    # Gemma 3's projector reads an image non-causally: the KV of its first rows was computed
    # seeing the rest, so a prefix cut inside it cannot be continued by feeding the rest.
    assert reusable(spans((5, 8), whole=True), 9) == 5
    assert reusable(spans((5, 8), whole=True), 13) == 13


def test_the_encoder_cache_drops_the_least_recently_used_beyond_its_bound():
    import numpy as np

    cache = EmbeddingCache(capacity=3 * 400)
    for key in "abc":
        cache.put(key, np.zeros((10, 10), dtype=np.float32))
    assert cache.get("a") is not None  # now the most recently used
    cache.put("d", np.zeros((10, 10), dtype=np.float32))
    assert cache.get("b") is None and cache.get("a") is not None and cache.bytes == 1200


def test_speculation_never_reads_an_images_positions():
    assert text_after_images([5, 6, -7, -8, 9, 10]) == [9, 10]
    assert text_after_images([5, 6]) == [5, 6]
    assert text_after_images([5, -6]) == []


# --- through the engine ------------------------------------------------------------------------


def submit(engine, prompt, media, **fields):
    return engine.submit(GenerationRequest(prompt, GREEDY, media=tuple(media), **fields))


def image(seed: int) -> Image:
    return Image.from_bytes(picture(seed=seed))


@pytest.fixture
def start_engine():
    engines = []

    def start(runner, **kwargs) -> Engine:
        engine = Engine(runner, itl_target=0.1, **kwargs).start()
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        engine.shutdown()


def test_a_text_only_model_refuses_images_naming_the_model(start_engine):
    engine = start_engine(FakeRunner())
    with pytest.raises(Refused) as refused:
        engine.submit(GenerationRequest("look: " + MEDIA_MARKER, media=(image(1),),
                                        model="smollm2"))  # fmt: skip
    assert refused.value.kind == RefusalKind.INVALID and refused.value.field == "images"
    assert refused.value.message.startswith("smollm2 does not take images")


def test_a_projector_the_engine_cannot_feed_refuses_images_saying_why(start_engine):
    runner = FakeVisionRunner()
    runner.image_problem = "its projector has no vision encoder"
    engine = start_engine(runner)
    with pytest.raises(Refused, match="ultravox does not take images: .*no vision") as refused:
        engine.submit(GenerationRequest(MEDIA_MARKER + "?", media=(image(1),), model="ultravox"))
    assert refused.value.kind == RefusalKind.INVALID


def test_token_ids_sent_as_a_prompt_cannot_pose_as_an_images_positions(start_engine):
    engine = start_engine(FakeVisionRunner())
    with pytest.raises(Refused, match="must not be negative") as refused:
        engine.submit(GenerationRequest((104, 105, -7, -8)))
    assert refused.value.kind == RefusalKind.INVALID


def test_a_prompt_with_images_is_read_in_chunks_that_end_where_an_image_ends(start_engine):
    runner = FakeVisionRunner(image_tokens=24, n_batch=16)
    engine = start_engine(runner)
    prompt = "two pictures: " + MEDIA_MARKER + " and " + MEDIA_MARKER + " which is older?"
    final = submit(engine, prompt, [image(1), image(2)]).result(timeout=10)
    assert final.type == "done", getattr(final, "message", final)
    assert final.figures["image_tokens"] == 48
    assert final.figures["prompt_tokens"] == len(prompt.replace(MEDIA_MARKER, "")) + 48
    assert runner.violations == []
    assert [phase["phase"] for phase in final.figures["timeline"]][:2] == ["encode", "queue"]


def test_an_image_the_projector_wants_whole_goes_in_one_step(start_engine):
    runner = FakeVisionRunner(image_tokens=12, whole=True, n_batch=16)
    engine = start_engine(runner)
    prompt = "ten chars: " + MEDIA_MARKER + "?"
    handle = submit(engine, prompt, [image(3)])
    assert handle.result(timeout=10).type == "done"
    assert runner.violations == []
    sizes = [n for _, _, _, n, _ in runner.chunks_of(handle.id)]
    assert 12 in sizes  # the image, alone in its step


@pytest.mark.parametrize("mrope", [False, True])
def test_a_cached_prefix_keeps_an_mrope_image_whole_when_the_prompt_ends_inside_it(
    start_engine, mrope
):
    # Asked again, a prompt that ends on its picture has all but its last token cached; with
    # M-RoPE that token's image is read again whole (its rows share one KV position).
    runner = FakeVisionRunner(image_tokens=6, mrope=mrope)
    engine = start_engine(runner)
    prompt = "describe: " + MEDIA_MARKER
    for _ in range(2):
        again = submit(engine, prompt, [image(9)], cache_key="tail").result(timeout=10)
    assert again.type == "done" and runner.violations == []
    assert again.figures["cached_tokens"] == (len("describe: ") if mrope else
                                              len("describe: ") + 6 - 1)  # fmt: skip


def test_the_same_image_again_is_not_encoded_again(start_engine):
    runner = FakeVisionRunner()
    engine = start_engine(runner)
    first = submit(engine, MEDIA_MARKER + MEDIA_MARKER + "same?", [image(4), image(4)])
    assert first.result(timeout=10).figures["images_encoded"] == 1
    again = submit(engine, MEDIA_MARKER + "and now?", [image(4)]).result(timeout=10)
    assert (again.figures["images_encoded"], again.figures["images_cached"]) == (0, 1)
    assert runner.encoded == [image(4).digest]
    assert engine.snapshot()["vision"]["images_encoded"] == 1


def test_an_image_is_cached_for_its_own_partition_only(start_engine):
    # A hit in another app's cache would tell it (images_cached, the encode's time) that
    # someone else sent the same picture: the camera app re-sending frames still hits its own.
    runner = FakeVisionRunner()
    engine = start_engine(runner)

    def send(partition):
        done = submit(engine, MEDIA_MARKER + "who?", [image(6)], cache_partition=partition)
        figures = done.result(timeout=10).figures
        return figures["images_encoded"], figures["images_cached"]

    assert send("app:camera") == (1, 0)
    assert send("app:other") == (1, 0)
    assert send(None) == (1, 0)
    assert send("app:camera") == (0, 1)
    assert send(None) == (0, 1)
    assert runner.encoded == [image(6).digest] * 3


def test_a_projectors_digest_is_a_sha256_or_nothing():
    from inference.engine.runner_config import RunnerConfig

    for wrong in ("abc", "g" * 64, None):
        with pytest.raises(ValueError, match="mmproj_sha256"):
            RunnerConfig(model_path="m.gguf", mmproj_sha256=wrong)
    assert RunnerConfig(model_path="m.gguf", mmproj_sha256="AB" * 32).mmproj_sha256 == "ab" * 32


def test_a_picture_that_does_not_decode_fails_that_request_only(start_engine):
    runner = FakeVisionRunner()
    runner.undecodable.add(image(5).digest)
    engine = start_engine(runner)
    stream = engine.submit(GenerationRequest("a text stream", SamplingParams(max_tokens=30)))
    bad = submit(engine, MEDIA_MARKER + "what?", [image(5)]).result(timeout=10)
    assert bad.type == "error" and bad.code == RefusalKind.INVALID
    assert "could not be decoded" in bad.message
    assert stream.result(timeout=10).type == "done"
    assert submit(engine, MEDIA_MARKER + "what?", [image(6)]).result(timeout=10).type == "done"


def test_a_prompt_too_long_with_its_image_tokens_is_refused_as_too_long(start_engine):
    runner = FakeVisionRunner(image_tokens=250, ctx_per_seq=256)
    engine = start_engine(runner)
    final = submit(engine, "a question about " + MEDIA_MARKER, [image(7)]).result(timeout=10)
    assert final.type == "error" and final.code == RefusalKind.TOO_LONG


def test_a_request_cancelled_while_its_images_are_encoded_ends_and_frees_its_place(start_engine):
    runner = FakeVisionRunner()
    runner.encode_gate = threading.Event()
    engine = start_engine(runner)
    handle = submit(engine, MEDIA_MARKER + "slow", [image(8)])
    phases = handle.events(timeout=10)
    assert next(phases).phase == "encoding"
    assert runner.encoding.wait(10)
    handle.cancel()
    final = handle.result(timeout=10)
    assert final.type == "done" and final.finish_reason == "cancelled"
    runner.encode_gate.set()
    assert submit(engine, MEDIA_MARKER + "next", [image(9)]).result(timeout=10).type == "done"
    assert wait_until(lambda: not engine.busy)


def test_streams_decode_while_an_image_is_encoded(start_engine):
    runner = FakeVisionRunner(overhead=0.01)  # a stream of 200 tokens lasts 2 s at least
    runner.encode_gate = threading.Event()
    engine = start_engine(runner)
    stream = engine.submit(GenerationRequest("a long answer", SamplingParams(max_tokens=200)))
    pictured = submit(engine, MEDIA_MARKER + "and this?", [image(10)])
    assert runner.encoding.wait(10)
    before = len(runner.steps)
    assert wait_until(lambda: len(runner.steps) >= before + 5)
    steps = engine.snapshot()["steps"]
    assert any(enc and dec for enc, dec in zip(steps["encoding"], steps["decode"], strict=True))
    runner.encode_gate.set()
    assert pictured.result(timeout=10).type == "done"
    stream.cancel()


def test_the_steps_leave_the_encoder_its_cores_while_it_encodes_and_take_them_back(start_engine):
    runner = FakeVisionRunner(overhead=0.01)
    runner.encode_gate = threading.Event()
    engine = start_engine(runner)
    stream = engine.submit(GenerationRequest("a long answer", SamplingParams(max_tokens=200)))
    pictured = submit(engine, MEDIA_MARKER + "and this?", [image(12)])
    assert runner.encoding.wait(10)
    before = len(runner.shared)
    assert wait_until(lambda: len(runner.shared) >= before + 3)
    assert all(runner.shared[before:]), "steps while the encoder works run on the other cores"
    runner.encode_gate.set()
    assert pictured.result(timeout=10).type == "done"
    after = len(runner.shared)
    assert wait_until(lambda: len(runner.shared) >= after + 3)
    assert runner.shared[-1] is False, "with the encoder idle the steps have every core again"
    stream.cancel()


def test_drafts_never_hold_or_follow_an_images_positions(start_engine):
    from .fakes import char_tokens

    runner = FakeVisionRunner(image_tokens=6)
    engine = start_engine(runner, speculation=Speculation("always"))
    # The answer repeats the text before the image: prompt lookup would draft on from there
    # into the image's positions if it could see them.
    runner.scripts["looked-up"] = char_tokens(" the photo of the garden, again")
    final = engine.submit(GenerationRequest(
        "see the photo of the garden" + MEDIA_MARKER + " and", SamplingParams(max_tokens=40),
        media=(image(11),), request_id="looked-up")).result(timeout=10)  # fmt: skip
    assert final.type == "done" and runner.violations == []
    assert final.text.startswith(" the photo of the garden"), final.text


def test_a_kept_prompt_with_an_image_comes_back_from_disk_after_a_restart(tmp_path):
    from inference.engine.tiers import KvLayout, PromptStore
    from inference.engine.tiers.disk import DiskTier

    layout = KvLayout("ef" * 32, 1, 1, 256, "f16", True, -1, FakeVisionRunner.state_format)
    prompt = "The camera by the door saw this: " + MEDIA_MARKER + " Who is it?"
    params = SamplingParams(temperature=0, max_tokens=6)
    figures = []
    for question in ("", " Is the door locked?"):
        store = PromptStore(1 << 20, DiskTier(tmp_path, layout, 1 << 30)).open()
        runner = FakeVisionRunner(image_tokens=32, n_slots=2, n_ctx=512, per_token=0.0003)
        engine = Engine(runner, prompts=store, itl_target=1.0).start()
        try:
            done = engine.submit(GenerationRequest(prompt + question, params, media=(image(12),),
                                                   cache_key="door", cache_partition="app:1"))
            figures.append(done.result(timeout=10).figures)  # fmt: skip
        finally:
            engine.shutdown(timeout=5)
            engine.persist_prompts(10)
        assert runner.violations == []
    assert figures[0]["cached_tokens"] == 0
    second = figures[1]
    assert second["cached_by_tier"]["disk"] == second["cached_tokens"]
    assert second["cached_tokens"] >= len("The camera by the door saw this: ") + 32
