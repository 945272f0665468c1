"""A draft model on real llama.cpp: a real small GGUF with the starter's vocabulary drafts, the
starter verifies, and at temperature 0 the answer is token for token the one without it, how
well or badly the draft model guesses; one whose vocabulary differs is set aside at load, with
the reason, and the model serves without it."""

import pytest

from inference.engine import Engine, GenerationRequest, SamplingParams
from inference.engine.speculation.policy import Speculation

from .draft_gguf import write_draft

pytestmark = pytest.mark.model

CHAT = "<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n"
PROSE = CHAT.format(q="Write a short story about the sea.")


@pytest.fixture(scope="module")
def tiny_draft(starter_path, tmp_path_factory):
    return write_draft(tmp_path_factory.mktemp("draft") / "tiny-draft.gguf", starter_path)


def answer(starter_path, extra_bufts, draft: str, mode: str | None, max_tokens: int = 64):
    """The starter's greedy answer to PROSE, with `draft` as its draft model ("" for none) and
    speculation in `mode` (None: off); the final event and the engine's speculation reading."""
    from inference.engine.runner import LlamaRunner
    from inference.engine.runner_config import RunnerConfig

    runner = LlamaRunner(RunnerConfig(model_path=str(starter_path), ctx_per_seq=512, parallel=1,
                                      cache_slots=0, n_threads=2, use_extra_bufts=extra_bufts,
                                      draft_model_path=draft))  # fmt: skip
    engine = Engine(runner, itl_target=1.0,
                    speculation=Speculation(mode) if mode else None).start()  # fmt: skip
    try:
        params = SamplingParams(temperature=0, max_tokens=max_tokens)
        events = list(engine.submit(GenerationRequest(PROSE, params)).events(timeout=600))
        reading = engine.snapshot()["speculation"]
        return events[-1], reading, runner.info()["draft_model"]
    finally:
        engine.shutdown()


def test_a_poor_draft_models_guesses_are_verified_and_change_nothing(
    starter_path, extra_bufts, tiny_draft
):
    plain, _, _ = answer(starter_path, extra_bufts, "", None)
    drafted, reading, info = answer(starter_path, extra_bufts, str(tiny_draft), "always")
    assert info["problem"] is None and info["size_bytes"] > 0
    assert drafted.text == plain.text
    assert reading["model_drafts"] > 5 and drafted.figures["drafted"] > 20


def test_a_draft_model_that_guesses_well_has_its_guesses_kept(starter_path, extra_bufts):
    # The starter drafting for itself: the best guesser there is (it pays nowhere, which is why
    # the model page refuses a model as its own draft; here it shows the guesses are kept).
    plain, _, _ = answer(starter_path, extra_bufts, "", None)
    drafted, reading, _ = answer(starter_path, extra_bufts, str(starter_path), "always")
    assert drafted.text == plain.text
    assert reading["model_drafts"] > 0
    assert drafted.figures["draft_accepted"] > 0.7 * drafted.figures["drafted"] > 10


def test_a_draft_model_with_another_vocabulary_is_set_aside_and_the_model_serves(
    starter_path, extra_bufts, tmp_path
):
    other = write_draft(tmp_path / "other.gguf", starter_path, bos_token_id=5)
    plain, _, _ = answer(starter_path, extra_bufts, "", None, max_tokens=16)
    served, reading, info = answer(starter_path, extra_bufts, str(other), "always", 16)
    assert "beginning-of-text token differs" in info["problem"]
    assert served.text == plain.text and reading["model_drafts"] == 0
