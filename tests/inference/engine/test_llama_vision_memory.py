"""Images remembered on real llama.cpp: the starter with the tiny random projector (tests/inference/
projector_gguf.py) and warm memory on a directory of its own. Each load here comes after the
last one's unload (its RAM tier written to disk, its runner closed): what a restart of the
appliance finds is that directory, read by a new runner.

Whether a picture was encoded is read from the encoder's own counters (the request's
images_encoded and images_cached figures, the engine's vision reading), never from a time.
"""

from pathlib import Path

import numpy as np
import pytest

from inference.engine import Engine, SamplingParams
from inference.engine.generation import GenerationRequest
from inference.engine.media import MEDIA_MARKER, Image
from inference.engine.tiers import images
from inference.engine.tiers.config import PromptCacheConfig, open_store
from tests.inference.projector_gguf import IMAGE_TOKENS, picture, write_projector

pytestmark = pytest.mark.model

GREEDY = SamplingParams(temperature=0.0, max_tokens=12)
# Long enough that a kept prompt of it shares less than half its tokens with another question
# about the same picture (the tiers then do not restore it for that question).
LONG = "Describe every part of this picture: " + "the corners, the edges, the middle, " * 12


def chat(question: str, history: str = "") -> str:
    return (f"{history}<|im_start|>user\n{MEDIA_MARKER}{question}<|im_end|>\n"
            "<|im_start|>assistant\n")  # fmt: skip


def then(turn: str, answer: str, question: str) -> str:
    """The next turn of a conversation: its picture stays where it was."""
    return (f"{turn}{answer}<|im_end|>\n<|im_start|>user\n{question}<|im_end|>\n"
            "<|im_start|>assistant\n")  # fmt: skip


def image(seed: int) -> Image:
    return Image.from_bytes(picture(64, 48, seed=seed))


@pytest.fixture(scope="module")
def projector(starter_path, tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("vision-memory") / "mmproj.gguf"
    return str(write_projector(path, Path(starter_path)))


@pytest.fixture
def load(starter_path, projector, extra_bufts, tmp_path):
    """Load the starter with the projector and warm memory on one directory; each call unloads
    the engine loaded before (its RAM tier written to disk) first."""
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig

    config = PromptCacheConfig(str(tmp_path / "embedded"), ram_bytes=1 << 30,
                               disk_bytes=1 << 30)  # fmt: skip
    loaded: list[Engine] = []

    def unload() -> None:
        if loaded:
            engine = loaded.pop()
            engine.shutdown()
            engine.persist_prompts(30)

    def make() -> Engine:
        unload()
        settings = RunnerConfig(model_path=str(starter_path), mmproj_path=projector,
                                ctx_per_seq=1024, parallel=2, cache_slots=0, n_threads=2,
                                use_extra_bufts=extra_bufts)  # fmt: skip
        runner = LlamaRunner(settings)
        engine = Engine(runner, itl_target=1.0,
                        prompts=open_store(config, settings, runner)).start()  # fmt: skip
        loaded.append(engine)
        return engine

    make.directory = Path(config.directory)
    yield make
    unload()


def answer(engine, prompt: str, seed: int, partition: str, key: str | None = None):
    """The final event and the sampled token ids."""
    request = GenerationRequest(prompt, GREEDY, media=(image(seed),), cache_partition=partition,
                                cache_key=key)  # fmt: skip
    ids, final = [], None
    for final in engine.submit(request).events(timeout=120):
        if final.type == "token" and final.token_id >= 0:
            ids.append(final.token_id)
    assert final.type == "done", getattr(final, "message", final)
    return final, ids


def image_files(load, partition: str) -> list[Path]:
    name = images.partition_name(partition)
    return sorted(load.directory.glob(f"*/*/{images.DIRECTORY}/{name}/*{images.SUFFIX}"))


def encoded(engine) -> tuple[int, int]:
    """The encoder's counters since load: images encoded, images read from disk."""
    vision = engine.snapshot()["vision"]
    return vision["images_encoded"], vision["images_from_disk"]


def test_an_image_encoded_once_is_read_from_disk_after_a_restart_and_forgotten_with_its_app(
    load,
):
    engine = load()
    first, _ = answer(engine, chat("What is this?"), 201, "apikey:1", "a")
    assert first.figures["images_encoded"] == 1 and encoded(engine) == (1, 0)
    assert len(image_files(load, "apikey:1")) == 1

    engine = load()
    again, _ = answer(engine, chat("Which colours are in it?"), 201, "apikey:1", "b")
    assert (again.figures["images_encoded"], again.figures["images_cached"]) == (0, 1)
    assert again.figures["image_tokens"] == IMAGE_TOKENS
    assert encoded(engine) == (0, 1)
    # Another app that sends the same picture learns nothing of the first one's: encoded anew.
    other, _ = answer(engine, chat("Which colours are in it?"), 201, "apikey:2", "b")
    assert (other.figures["images_encoded"], other.figures["images_cached"]) == (1, 0)

    assert engine.forget_prompts("apikey:1").result(timeout=30) >= 1
    assert engine.prompts.disk.drain(10)
    assert image_files(load, "apikey:1") == [] and len(image_files(load, "apikey:2")) == 1
    forgotten, _ = answer(engine, chat("What is this?"), 201, "apikey:1", "a")
    assert forgotten.figures["images_encoded"] == 1  # neither on disk nor in RAM any more


def test_a_prompt_with_an_image_survives_an_unload_warm_and_restores_its_own_answer(load):
    engine = load()
    first_turn = chat("What is in the picture?")
    first, _ = answer(engine, first_turn, 202, "apikey:1", "turns")
    second_turn = then(first_turn, first.text, "And its colours?")

    engine = load()
    second, ids = answer(engine, second_turn, 202, "apikey:1", "turns")
    figures = second.figures
    assert figures["cached_tokens"] >= 0.8 * figures["prompt_tokens"]
    assert figures["cached_by_tier"]["disk"] == figures["cached_tokens"]  # its image span too
    assert figures["images_encoded"] == 0 and encoded(engine) == (0, 1)

    # Kept whole once more, its KV (image positions included) restored gives the same answer.
    engine = load()
    again, ids_again = answer(engine, second_turn, 202, "apikey:1", "turns")
    assert again.figures["cached_by_tier"]["disk"] == again.figures["prompt_tokens"] - 1
    assert ids_again == ids and again.text == second.text


def test_a_corrupt_image_on_disk_is_encoded_again_and_gives_the_same_answer(load, caplog):
    engine = load()
    answer(engine, chat(LONG), 203, "apikey:1", "long")
    # The reference: the same question read cold, in another app's partition.
    reference, reference_ids = answer(engine, chat("What is this?"), 203, "apikey:ref", "ref")
    (path,) = image_files(load, "apikey:1")
    written = path.read_bytes()

    engine = load()
    damaged = bytearray(written)
    damaged[-7] ^= 0x40  # one bit of one row
    path.write_bytes(bytes(damaged))
    final, ids = answer(engine, chat("What is this?"), 203, "apikey:1", "short")
    assert final.figures["cached_tokens"] == 0  # no kept prompt spared it the image
    assert (final.figures["images_encoded"], final.figures["images_cached"]) == (1, 0)
    assert encoded(engine) == (1, 0)
    assert ids == reference_ids and final.text == reference.text
    assert "is unusable" in caplog.text
    assert engine.prompts.disk.drain(10)
    assert path.read_bytes() == written  # encoded again, kept again, as it was
    rows = images.read(path, path.stem, IMAGE_TOKENS, engine.runner.image_width)
    assert rows.shape == (IMAGE_TOKENS, engine.runner.image_width) and np.isfinite(rows).all()
